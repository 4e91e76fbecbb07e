"""Bounds on a completion request's tokens, from its body alone (no tokenizer on the way).

Two bounds, each safe in its own direction:
- above, to reserve: the prompt has at most as many tokens as the request body has bytes.
  Byte-level BPE (GPT-2's kind: Llama 3, Qwen, SmolLM2) never makes more tokens than the text
  has bytes, and the body's JSON carries every byte of the text plus keys and quotes, which
  cover the chat template's few tokens per message.
- below, to refuse: each word (run of non-space) of the prompt's text is at least one token,
  and at least one per TOKEN_CHARS_MAX of its characters, since tokenizers that split on
  whitespace first (GPT-2's pre-tokenizer, SentencePiece's default) never join two words in
  one token, and no token is longer than the longest of its vocabulary. Only a prompt whose
  floor alone passes the context is refused: it is certainly too long, and the engine does not
  spend time tokenizing it.

The context is the catalog's, at most the largest a ready replica of the model runs with (the
engine's own, as its agent reports it, or the one the scheduler placed it with); with no
catalog context, that largest. While a roll to a larger context is half done, the old replicas
hold less: a request is sent only to a replica that holds it (need), and refused in the route's
own words only when none does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmgwd.catalog import Model
from llmgwd.nodes.pool import Endpoint
from llmgwd.router import errors, fields

# Reserved per choice, and written as max_tokens, when neither the request, the catalog nor
# any ready replica bounds the answer (set the model's context or max_tokens to change it).
UNBOUNDED_COMPLETION = 4096
# More characters than any token of a vocabulary has: SmolLM2's longest word-like token (a run
# of '#') is 80; runs of whitespace, which are longer, are not counted in words.
TOKEN_CHARS_MAX = 256

Document = dict[str, Any]
_LIMIT_PARAMS = ("max_tokens", "max_completion_tokens")


@dataclass(frozen=True, slots=True)
class Estimate:
    """The most tokens a request may use: its prompt's and all its choices' completions; and
    how many requests it counts as against a requests-per-minute limit (one per prompt).
    billed: whether its tokens are meant for budgets and spend too, not only for the tokens per
    minute (counting a prompt's tokens is not billed, as Anthropic bills none: the Meter holds
    it to the rates only, and counts it as one request of no tokens)."""

    prompt: int
    completion: int
    requests: int = 1
    billed: bool = True

    @property
    def total(self) -> int:
        """Prompt and completion together."""
        return self.prompt + self.completion


def estimate(doc: Document, model: Model, body_bytes: int, context: int = 0) -> Estimate:
    """Check the request against the model's limits and bound its tokens; context is what a
    replica it may go to holds (held_context; 0: not known).

    doc must have passed the router's body checks (router.fields); it is changed: the completion
    limit reserved is written as max_tokens (and max_completion_tokens, when given), so the
    engine holds to what was reserved.
    """
    check_context(doc, context, body_bytes)
    completion = completion_limit(doc, model, context) * choices(doc)
    return Estimate(prompt=body_bytes, completion=completion, requests=fields.prompts(doc))


def held_context(model: Model, ready: Sequence[Endpoint]) -> int:
    """The most tokens a request to model may hold: the catalog's context, at most the largest
    of its ready replicas' (a prompt longer than any of them holds is refused before an engine
    sees it); the catalog's, else that largest, when only one is known; 0: neither is."""
    largest = max((e.context for e in ready), default=0)
    if model.context and largest:
        return min(model.context, largest)
    return model.context or largest


def need(ready: Sequence[Endpoint], body_bytes: int, context: int) -> int:
    """The least context a replica must run with to be sent this request (Balancer.acquire):
    its prompt's upper bound (the body's bytes), or context (held_context) when that bound is
    larger, so that only the replicas holding the most take a prompt that may be that long;
    0 when every ready replica holds it (one context for all: the usual case). A replica
    whose context is not known (0) is not held back."""
    least = min(body_bytes, context)
    return least if any(0 < e.context < least for e in ready) else 0


def completion_limit(doc: Document, model: Model, context: int) -> int:
    """The most completion tokens of one choice; 400 when the request asks more than allowed.
    context is what its replicas hold (held_context; 0: not known)."""
    cap = model.max_tokens or context
    asked: list[int] = []
    for param in _LIMIT_PARAMS:
        value = doc.get(param)
        if value is None:
            continue
        if cap and value > cap:
            raise errors.max_tokens_too_large(param, value, cap)
        asked.append(value)
    # Unasked, the engine would stop only at the context's end: the bound reserved goes instead.
    limit = min(asked) if asked else model.max_tokens or context or UNBOUNDED_COMPLETION
    for param in _LIMIT_PARAMS:  # both, so whichever the engine reads holds to the limit
        if param == "max_tokens" or doc.get(param) is not None:
            doc[param] = limit
    return limit


def choices(doc: Document) -> int:
    """How many completions the request makes: n (or best_of) times its prompts."""
    return max(_int(doc.get("n")), _int(doc.get("best_of"))) * fields.prompts(doc)


def check_context(doc: Document, context: int, body_bytes: int) -> None:
    """400 when the prompt (or an embedding's input) is certainly longer than context (what
    the model's replicas hold, held_context; 0: not known, nothing refused)."""
    if not context or body_bytes <= context:
        return  # the upper bound fits already: nothing to count
    param = next((p for p in ("messages", "input") if p in doc), "prompt")
    at_least = prompt_floor(doc)
    if at_least > context:
        raise errors.context_length_exceeded(param, at_least, context)


def prompt_floor(doc: Document) -> int:
    """Fewest tokens the prompt can have (of the longest prompt, when there are several)."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        return sum(_words(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = doc.get("prompt", doc.get("input"))
    if isinstance(prompt, str):
        return _words(prompt)
    if isinstance(prompt, list) and prompt:
        if isinstance(prompt[0], int):
            return len(prompt)  # token ids
        return max(len(p) if isinstance(p, list) else _words(p) for p in prompt)
    return 0


def _words(content: object) -> int:
    """Fewest tokens of a message's content (a text, or parts of which some are texts): each
    word one at least, and one per TOKEN_CHARS_MAX of its characters."""
    if isinstance(content, str):
        return sum(-(-len(word) // TOKEN_CHARS_MAX) for word in content.split())
    if isinstance(content, list):
        return sum(_words(part.get("text")) for part in content if isinstance(part, dict))
    return 0


def _int(value: object) -> int:
    """A positive count from the body, else 1 (the engine judges what it was given)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def one_limit(doc: Document, model: Model, context: int, param: str) -> int:
    """The most answer tokens of a request whose limit is the one field param (Responses'
    max_output_tokens, Anthropic's max_tokens): 400 over the model's cap; written in when
    absent, so the engine holds to what was reserved."""
    cap = model.max_tokens or context
    value = doc.get(param)
    if isinstance(value, int) and cap and value > cap:
        raise errors.max_tokens_too_large(param, value, cap)
    limit = value if isinstance(value, int) else cap or UNBOUNDED_COMPLETION
    doc[param] = limit
    return limit
