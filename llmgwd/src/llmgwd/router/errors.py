"""The /v1 errors (llmgw.errors.ApiError in OpenAI's shape), built in one place, and the
middleware that answers /v1 failures."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from llmgw.errors import ApiError as ApiError
from llmgwd.clientport.forwarded import client_address
from llmgwd.router.exchange import EXCHANGE, Exchange

log = logging.getLogger("llmgwd.router")

_MAX_ECHO = 200  # longest client-supplied text (a model name) quoted back in a message


def quote(text: str) -> str:
    """Client text for a message, cut short so a huge value cannot flood logs or answers."""
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


# One function per kind of error.


def invalid_api_key(message: str) -> ApiError:
    """401: no key, an unknown key or a revoked one (the message says which, never the key)."""
    return ApiError(401, message, "invalid_request_error", code="invalid_api_key")


def invalid_json(message: str) -> ApiError:
    """400: the body is not a JSON object."""
    return ApiError(400, message, "invalid_request_error", code="invalid_json")


def missing_parameter(param: str) -> ApiError:
    """400: a required field is absent."""
    return ApiError(
        400,
        f"Missing required parameter: '{param}'.",
        "invalid_request_error",
        param=param,
        code="missing_required_parameter",
    )


def invalid_type(param: str, expected: str, got: object) -> ApiError:
    """400: a field has the wrong JSON type."""
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {json_type(got)} instead.",
        "invalid_request_error",
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, message: str) -> ApiError:
    """400: a field has the right type but a value that cannot be used."""
    return ApiError(400, message, "invalid_request_error", param=param, code="invalid_value")


def unknown_parameter(param: str) -> ApiError:
    """400: a field the route does not take (engine-specific ones included), in OpenAI's words."""
    return ApiError(
        400,
        f"Unrecognized request argument supplied: {quote(param)}",
        "invalid_request_error",
        param=quote(param),
        code="unknown_parameter",
    )


def unsupported_parameter(param: str, message: str) -> ApiError:
    """400: one of OpenAI's fields that the model (its engine) cannot honour."""
    return ApiError(
        400, message, "invalid_request_error", param=param, code="unsupported_parameter"
    )


def request_timeout(why: str) -> ApiError:
    """408: the body came too slowly (the client port's settings bound it)."""
    return ApiError(
        408,
        f"The request body was not received in time: {why}",
        "invalid_request_error",
        code="request_timeout",
    )


def request_too_large(limit: int) -> ApiError:
    """413: the body is over the configured size."""
    return ApiError(
        413,
        f"Request body too large: the limit is {limit} bytes.",
        "invalid_request_error",
        code="request_too_large",
    )


def model_not_found(model: str) -> ApiError:
    """404: the model is not in the catalog."""
    return ApiError(
        404,
        f"The model '{quote(model)}' does not exist.",
        "invalid_request_error",
        param="model",
        code="model_not_found",
    )


def unknown_url(method: str, path: str) -> ApiError:
    """404: no such route under /v1."""
    return ApiError(
        404,
        f"Invalid URL ({method} {quote(path)}).",
        "invalid_request_error",
        code="unknown_url",
    )


def method_not_allowed(method: str, path: str, allowed: set[str]) -> ApiError:
    """405: the route exists, the method does not."""
    allow = ", ".join(sorted(allowed))
    return ApiError(
        405,
        f"Method {method} is not allowed on {quote(path)}; use {allow}.",
        "invalid_request_error",
        code="method_not_allowed",
        headers={"Allow": allow},
    )


def model_unavailable(message: str, retry_after_s: int) -> ApiError:
    """503: the model is known but no replica can take the request now."""
    return ApiError(
        503,
        message,
        "server_error",
        code="model_not_ready",
        headers={"Retry-After": str(retry_after_s)},
    )


def store_unreachable(stale_s: float, retry_after_s: int) -> ApiError:
    """503: this control plane lost the cluster's store long enough that its keys and models
    may be out of date (a key revoked meanwhile must not keep working here)."""
    return ApiError(
        503,
        f"This control plane has been cut off from the cluster's store for {stale_s:.0f} s, "
        "so it cannot tell whether your key is still valid; send the request to another "
        "control plane.",
        "server_error",
        code="store_unreachable",
        headers={"Retry-After": str(retry_after_s)},
    )


def model_busy(message: str, retry_after_s: int) -> ApiError:
    """503: every replica of the model is full and the request waited its turn in vain."""
    return ApiError(
        503, message, "server_error", code="model_busy", headers={"Retry-After": str(retry_after_s)}
    )


def max_tokens_too_large(param: str, value: int, cap: int) -> ApiError:
    """400: max_tokens (or max_completion_tokens) over what the model allows (the catalog's
    max_tokens, else the context its replicas hold: token_bounds.held_context)."""
    return invalid_value(
        param,
        f"{param} is too large: {value}. This model supports at most {cap} completion tokens, "
        f"whereas you provided {value}.",
    )


def context_length_exceeded(param: str, at_least: int, context: int) -> ApiError:
    """400: the prompt alone is longer than the model's context."""
    return ApiError(
        400,
        f"This model's maximum context length is {context} tokens, but the prompt has at "
        f"least {at_least} tokens. Please reduce the length of the {param}.",
        "invalid_request_error",
        param=param,
        code="context_length_exceeded",
    )


def rate_limited(message: str, type_: str, headers: Mapping[str, str]) -> ApiError:
    """429: the key's requests or tokens per minute are used up for now (type_ says which)."""
    return ApiError(429, message, type_, code="rate_limit_exceeded", headers=headers)


def quota_exceeded(message: str, headers: Mapping[str, str]) -> ApiError:
    """429: the key's budget for the period is spent, as OpenAI says it of a used-up quota."""
    return ApiError(429, message, "insufficient_quota", code="insufficient_quota", headers=headers)


def model_not_supported(model: str, what: str) -> ApiError:
    """400: the model does not do what the request needs (embeddings, tools, image input)."""
    return ApiError(
        400,
        f"The model '{quote(model)}' does not support {what}.",
        "invalid_request_error",
        param="model",
        code="model_not_supported",
    )


def engine_refused(message: str, param: str | None = None) -> ApiError:
    """400: the engine refused the request for something in its body (message already cleaned
    of engine internals by router/answers.py)."""
    return ApiError(400, message, "invalid_request_error", param=param, code="invalid_request")


def upstream_failed(message: str) -> ApiError:
    """502: the engine broke the exchange."""
    return ApiError(502, message, "server_error", code="upstream_error")


def upstream_timeout(message: str) -> ApiError:
    """504: the engine did not answer in time."""
    return ApiError(504, message, "server_error", code="upstream_timeout")


def client_closed() -> ApiError:
    """499 (nginx's code, for the log only): the client left before its request was complete."""
    return ApiError(499, "The client closed the request.", "invalid_request_error")


def internal_error(request_id: str) -> ApiError:
    """500: a bug of ours; the request id lets staff find the traceback."""
    return ApiError(
        500,
        f"The server had an error while processing your request (request id {request_id}).",
        "server_error",
    )


def from_http_exception(request: web.Request, exc: web.HTTPException) -> ApiError:
    """aiohttp's own refusals (no route, wrong method, body over client_max_size) in our shape."""
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return method_not_allowed(request.method, request.path, exc.allowed_methods)
    if isinstance(exc, web.HTTPNotFound):
        return unknown_url(request.method, request.path)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return request_too_large(request.client_max_size)
    type_ = "server_error" if exc.status >= 500 else "invalid_request_error"
    return ApiError(exc.status, exc.reason, type_)


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages."""
    names: tuple[tuple[type, str], ...] = (
        (bool, "a boolean"),  # before int: bool is an int in Python
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "an array"),
        (dict, "an object"),
    )
    for kind, name in names:
        if isinstance(value, kind):
            return name
    return "null"


# The middleware: request id, errors in our shape, one log line per request.

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# What a request's end is told to (the router's metrics): its status, its error if any, its
# exchange (when its handling began among what it holds).
Ended = Callable[[web.Request, int, "ApiError | None", Exchange], None]
# An error the handler did not shape itself (a bug's 500, aiohttp's own refusals) put in its
# route's shape (router/v1_routes.py).
Shape = Callable[[web.Request, "ApiError"], "ApiError"]


def middleware(ended: Ended | None = None, shape: Shape | None = None) -> Middleware:
    """The outermost /v1 middleware (error_middleware), ended told of each request as it ends:
    one middleware, not two, on every request's path."""

    @web.middleware
    async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Answer every failure in OpenAI's shape and log one line per request; it also makes
        the request's exchange (router/exchange.py), which notes when its handling began."""
        rid, started = secrets.token_hex(12), time.perf_counter()
        if hdrs.EXPECT in request.headers and (early := request.get(EXCHANGE)) is not None:
            ex = early  # made by its expect handler, run first (router/expect.py)
            ex.request_id, ex.started = rid, started
        else:
            request[EXCHANGE] = ex = Exchange(rid, started)
        error: ApiError | None = None
        unexpected: BaseException | None = None
        try:
            response = await handler(request)
        except asyncio.CancelledError:  # the daemon cancels handlers of clients that left
            ex.outcome = "cancelled"
            _log_request(request, ex, 499, None, None)
            if ended is not None:
                ended(request, 499, None, ex)
            raise
        except ApiError as e:  # its traceback holds this frame, which would hold it: a cycle
            error = e.with_traceback(None)  # a request's worth for the collector to find
        except web.HTTPException as e:
            if e.status < 400:  # a redirect is not a failure
                if ended is not None:
                    ended(request, e.status, None, ex)
                raise
            error = from_http_exception(request, e)
            error = error if shape is None else shape(request, error)
        except Exception as e:  # a daemon never dies of a request
            unexpected = e
            error = internal_error(ex.request_id)
            error = error if shape is None else shape(request, error)
        if error is not None:
            response = await _answer(ex, error)
        if ended is not None:  # a stream that failed counts with its error's status
            ended(request, response.status if error is None else error.status, error, ex)
        _log_request(request, ex, response.status, error, unexpected)
        return response

    return error_middleware


error_middleware = middleware()


async def _answer(ex: Exchange, error: ApiError) -> web.StreamResponse:
    """The error as a response, or as the last event of a stream whose headers already went out."""
    started = ex.stream
    if started is None:
        return error.response()
    with suppress(ConnectionError, RuntimeError):  # the client may be gone already
        await started.write(error.sse_event())
    return started


def _log_request(
    request: web.Request,
    ex: Exchange,
    status: int,
    error: ApiError | None,
    unexpected: BaseException | None,
) -> None:
    """The one access line; an unexpected failure carries its traceback on that same line."""
    level = logging.INFO
    if status >= 500:
        level = logging.ERROR if unexpected is not None else logging.WARNING
    if not log.isEnabledFor(level):
        return
    duration = time.perf_counter() - ex.started
    rid, replica, model, key_id = ex.request_id, ex.replica, ex.model, ex.key_id
    # never the query string: a key might have been put there. client: the TCP peer, or
    # X-Forwarded-For's right-most address not of client.trusted_proxies when the peer is one.
    line = (
        f"{request.method} {request.path} status={status} ms={duration * 1000:.0f} "
        f"client={client_address(request) or '-'} "
        f"model={quote('-' if model is None else model)} key={'-' if key_id is None else key_id} "
        f"replica={replica or '-'} rid={rid}"
    )
    if outcome := ex.outcome:
        line += f" outcome={outcome}"
    if error is not None:
        line += f" error={error.detail.code or error.detail.type}: {error.detail.message}"
    exc_info = (type(unexpected), unexpected, unexpected.__traceback__) if unexpected else None
    # Journal fields (LLMGW_REQUEST...); the model only once a replica served it, so a
    # client's made-up model name never becomes a field value.
    fields: dict[str, object] = {"request": rid, "key_id": key_id}
    if replica:
        fields |= {"model": model, "replica": replica}
    log.log(level, _one_line(line), exc_info=exc_info, extra=fields)


def _one_line(text: str) -> str:
    """Client text (a path, a model name) must not start a forged log line of its own."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)
