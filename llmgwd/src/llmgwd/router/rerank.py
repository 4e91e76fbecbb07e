"""POST /v1/rerank (llama.cpp's and vLLM's, as Jina and Cohere shape it): its allow-list of
fields, the tokens it may use, and its answer as a client sees it, its usage read."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from llmgwd.catalog import Model
from llmgwd.router import fields
from llmgwd.router.fields import MAX_INPUTS, Count, Text
from llmgwd.router.token_bounds import Estimate
from llmgwd.router.usage_events import Tally

Document = dict[str, Any]

_FIELDS = frozenset({"id", "object", "model", "results", "usage"})
_USAGE = ("prompt_tokens", "total_tokens")


class RerankRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/rerank."""

    model: Text
    query: str
    documents: Annotated[list[str], Meta(min_length=1, max_length=MAX_INPUTS)]
    top_n: Count | None = None
    return_documents: bool | None = None


def check(doc: Document) -> str:
    """The route's fields; returns the model's name."""
    return fields.checked(doc, RerankRequest).model


def bound(doc: Document, model: Model, body_bytes: int, context: int = 0) -> Estimate:
    """At most as many prompt tokens as the body has bytes, no answer tokens; one request."""
    return Estimate(prompt=body_bytes, completion=0)


def clean(doc: Document, model: str, tally: Tally) -> Document | None:
    """The answer with its own fields only, named by the catalog's model; usage if given."""
    out = {k: v for k, v in doc.items() if k in _FIELDS}
    if "model" in out:
        out["model"] = model
    usage = out.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {k: usage[k] for k in _USAGE if k in usage}
        tally.took(usage.get("prompt_tokens"), 0)
    return out
