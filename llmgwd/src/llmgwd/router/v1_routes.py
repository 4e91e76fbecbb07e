"""The /v1 routes the engines serve, one record each (router/route.py): the only module that
knows the routes' own modules; the handlers hand a request's record to every concern."""

from __future__ import annotations

from aiohttp import web

from llmgwd.router import (
    anthropic_errors,
    embeddings,
    errors,
    fields,
    folding,
    messages,
    rerank,
    responses,
    responses_errors,
    transcriptions,
)
from llmgwd.router.engine_refusals import Words
from llmgwd.router.exchange import EXCHANGE
from llmgwd.router.route import Route
from llmgwd.router.token_bounds import estimate
from llmgwd.router.usage_events import CHUNK_TOKENS, MESSAGES_TOKENS, RESPONSES_TOKENS


def _anthropic(error: errors.ApiError, _events: int = 0) -> errors.ApiError:
    return anthropic_errors.shaped(error)


CHAT = Route("chat/completions", fields.chat, estimate,
             Words("chat/completions", "messages", "response_format"), fold=folding.chat,
             tokens=CHUNK_TOKENS, usage_option=True, slots=True)  # fmt: skip
COMPLETIONS = Route("completions", fields.completion, estimate, Words("completions", "prompt"),
                    fold=folding.completion, tokens=CHUNK_TOKENS, usage_option=True,
                    slots=True)  # fmt: skip
EMBEDDINGS = Route("embeddings", embeddings.check, embeddings.bound,
                   Words("embeddings", "input", optional=True))  # fmt: skip
RESPONSES = Route("responses", responses.check, responses.bound, responses.WORDS,
                  clean=responses.clean, shape=responses_errors.shaped, fold=folding.responses,
                  opening=responses.opening, tokens=RESPONSES_TOKENS, slots=True)  # fmt: skip
MESSAGES = Route("messages", messages.check, messages.bound, messages.WORDS,
                 clean=messages.clean, shape=_anthropic, fold=folding.messages,
                 opening=messages.opening, tokens=MESSAGES_TOKENS, slots=True)  # fmt: skip
COUNT_TOKENS = Route("messages/count_tokens", messages.check_count, messages.bound_count,
                     messages.COUNT_WORDS, clean=messages.clean, shape=_anthropic)  # fmt: skip
RERANK = Route("rerank", rerank.check, rerank.bound, Words("rerank", optional=True),
               clean=rerank.clean)  # fmt: skip
# A multipart form, not JSON: its handler reads and bounds it (router/transcriptions.py).
TRANSCRIPTIONS = Route("audio/transcriptions", None, None,
                       Words("audio/transcriptions", optional=True),
                       clean=transcriptions.clean)  # fmt: skip

ROUTES = {r.path: r for r in (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, COUNT_TOKENS,
                              RERANK, TRANSCRIPTIONS)}  # fmt: skip


def for_request(request: web.Request, error: errors.ApiError) -> errors.ApiError:
    """error in the shape of the /v1 route request is on (OpenAI's on any other path): for the
    error middleware, which sees what no handler shaped."""
    route = ROUTES.get(request.path.partition("/v1/")[2])
    if route is None:
        return error
    tally = request[EXCHANGE].tally
    return route.shape(error, tally.events or 0 if tally is not None else 0)
