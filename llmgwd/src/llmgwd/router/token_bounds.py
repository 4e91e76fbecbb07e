"""Bounds on a completion request's tokens, from its body alone (no tokenizer on the way).

Two bounds, each safe in its own direction:
- above, to reserve: the prompt has at most as many tokens as the request body has bytes.
  Byte-level BPE (GPT-2's kind: Llama 3, Qwen, SmolLM2) never makes more tokens than the text
  has bytes, and the body's JSON carries every byte of the text plus keys and quotes, which
  cover the chat template's few tokens per message.
- below, to refuse: the prompt has at least as many tokens as its text has words (runs of
  non-space), since tokenizers that split on whitespace first (GPT-2's pre-tokenizer,
  SentencePiece's default) never join two words in one token. Only a prompt whose word count
  alone passes the context is refused: it is certainly too long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmgwd.catalog import Model
from llmgwd.router import errors

# Reserved per choice when neither the request nor the catalog bounds the answer: settled to
# the real count, but not a bound (set the model's context or max_tokens in the catalog).
UNBOUNDED_COMPLETION = 4096

Document = dict[str, Any]
_LIMIT_PARAMS = ("max_tokens", "max_completion_tokens")


@dataclass(frozen=True, slots=True)
class Estimate:
    """The most tokens a request may use: its prompt's and all its choices' completions."""

    prompt: int
    completion: int

    @property
    def total(self) -> int:
        """Prompt and completion together."""
        return self.prompt + self.completion


def estimate(doc: Document, model: Model, body_bytes: int) -> Estimate:
    """Check the request against the model's limits and bound its tokens.

    doc must have passed the router's body checks; it may be changed: the completion limit is
    written as max_tokens (and max_completion_tokens, when given) whenever the request or the
    catalog sets one, so the engine holds to what was reserved.
    """
    check_context(doc, model, body_bytes)
    return Estimate(prompt=body_bytes, completion=completion_limit(doc, model) * choices(doc))


def completion_limit(doc: Document, model: Model) -> int:
    """The most completion tokens of one choice; 400 when the request asks more than allowed."""
    cap = model.max_tokens or model.context
    asked: list[int] = []
    for param in _LIMIT_PARAMS:
        value = doc.get(param)
        if value is None:
            continue
        if cap and value > cap:
            raise errors.max_tokens_too_large(param, value, cap)
        asked.append(value)
    if asked:
        limit = min(asked)
    elif model.max_tokens:
        limit = model.max_tokens
    else:  # the engine stops at the context's end, when the catalog knows it
        return model.context or UNBOUNDED_COMPLETION
    for param in _LIMIT_PARAMS:  # both, so whichever the engine reads holds to the limit
        if param == "max_tokens" or doc.get(param) is not None:
            doc[param] = limit
    return limit


def choices(doc: Document) -> int:
    """How many completions the request makes: n (or best_of) times its prompts."""
    count = max(_int(doc.get("n")), _int(doc.get("best_of")))
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        count *= len(prompt)  # several prompts (texts or token lists), each its own answer
    return count


def check_context(doc: Document, model: Model, body_bytes: int) -> None:
    """400 when the prompt is certainly longer than the model's context."""
    if not model.context or body_bytes <= model.context:
        return  # the upper bound fits already: nothing to count
    param = "messages" if "messages" in doc else "prompt"
    at_least = prompt_floor(doc)
    if at_least > model.context:
        raise errors.context_length_exceeded(param, at_least, model.context)


def prompt_floor(doc: Document) -> int:
    """Fewest tokens the prompt can have (of the longest prompt, when there are several)."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        return sum(_words(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return _words(prompt)
    if isinstance(prompt, list) and prompt:
        if isinstance(prompt[0], int):
            return len(prompt)  # token ids
        return max(len(p) if isinstance(p, list) else _words(p) for p in prompt)
    return 0


def _words(content: object) -> int:
    """Words of a message's content: a text, or parts of which some are texts."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(_words(part.get("text")) for part in content if isinstance(part, dict))
    return 0


def _int(value: object) -> int:
    """A positive count from the body, else 1 (the engine judges what it was given)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
