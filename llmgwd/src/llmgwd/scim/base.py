"""SCIM's own answers: its media type, its error body, the bearer token's check and the app's
context (the catalog, whose active users stop keys, and the settings' group rules)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from llmgw.config import GroupRule
from llmgw.errors import SCIM, SCIM_ERROR, SCIM_MEDIA, ApiError
from llmgwd.catalog import Catalog
from llmgwd.scim import token
from llmgwd.stored_token import bearer

log = logging.getLogger(__name__)

MEDIA = SCIM_MEDIA
ERROR = SCIM_ERROR
LIST = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
SEARCH = "urn:ietf:params:scim:api:messages:2.0:SearchRequest"
PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
# A body's bounds, kept by read_doc (a sub-app's client_max_size is not applied); SCIM's
# deepest body (a PATCH of emails) nests 6 deep.
MAX_BODY_BYTES = 1024 * 1024
MAX_DEPTH = 16

Doc = dict[str, Any]


@dataclass(frozen=True)
class ScimContext:
    """What the SCIM routes use: the catalog (and its store) and the group rules."""

    catalog: Catalog
    rules: tuple[GroupRule, ...] = ()


CTX = web.AppKey("llmgw.scim", ScimContext)


class ScimError(ApiError):
    """An ApiError in SCIM's shape (llmgw.errors.SCIM), said in SCIM's words: its detail
    (shown: it names no secret) and scimType (its code)."""

    shape = SCIM

    def __init__(self, status: int, detail: str, scim_type: str = "") -> None:
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        super().__init__(status, detail, type_, scim_type or None)


def fail(status: int, detail: str, scim_type: str = "") -> NoReturn:
    """Raise a SCIM error."""
    raise ScimError(status, detail, scim_type)


def answer(doc: Doc, status: int = 200) -> web.Response:
    """A SCIM document as the answer."""
    return web.Response(status=status, text=json.dumps(doc), content_type=MEDIA)


def error_answer(e: ScimError) -> web.Response:
    """RFC 7644 3.12's error body."""
    return e.response()


def require_schema(body: Doc, urn: str, what: str) -> None:
    """400 invalidSyntax unless the body's schemas is a list that names urn."""
    schemas = body.get("schemas")
    if not isinstance(schemas, list) or urn not in schemas:
        fail(400, f"{what} names the schema {urn}", "invalidSyntax")


def ctx(request: web.Request) -> ScimContext:
    """The SCIM app's context."""
    return request.config_dict[CTX]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error in SCIM's shape: the handlers', aiohttp's (404, 405), and the unexpected."""
    try:
        return await handler(request)
    except ScimError as e:
        log.info(
            "SCIM %s %s refused: %s %s", request.method, request.path, e.status, e.detail.message
        )
        return error_answer(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        detail = f"no SCIM resource at {request.path}" if e.status == 404 else e.reason
        return error_answer(ScimError(e.status, detail))
    except Exception:
        log.exception("SCIM %s %s failed", request.method, request.path)
        return error_answer(ScimError(500, "the server failed to answer this request"))


@web.middleware
async def token_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Only the SCIM token passes (`Authorization: Bearer TOKEN`): no API key does."""
    if not await token.SCIM.matches(ctx(request).catalog.store, bearer(request)):
        fail(401, "the SCIM bearer token is missing or not valid")
    return await handler(request)


async def read_doc(request: web.Request) -> Doc:
    """The request's JSON object (RFC 7644: application/scim+json or application/json), at
    most MAX_BODY_BYTES (413) and MAX_DEPTH deep (400 invalidSyntax)."""
    raw = await _read(request)
    try:
        doc = json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        fail(400, f"the body nests deeper than {MAX_DEPTH} levels", "invalidSyntax")
    except ValueError:
        fail(400, "the body is not JSON", "invalidSyntax")
    if not isinstance(doc, dict):
        fail(400, "the body is not a JSON object", "invalidSyntax")
    if _deeper(doc, MAX_DEPTH):
        fail(400, f"the body nests deeper than {MAX_DEPTH} levels", "invalidSyntax")
    return doc


def _not_json(word: str) -> NoReturn:
    raise ValueError(f"{word} is not JSON")  # Python's json takes NaN and Infinity


def _deeper(doc: object, limit: int) -> bool:
    """Whether doc nests objects and lists more than limit deep (doc itself is level 1)."""
    level: list[object] = [doc]
    for _ in range(limit):
        level = [v for c in level if isinstance(c, dict | list)
                 for v in (c.values() if isinstance(c, dict) else c)]  # fmt: skip
        if not level:
            return False
    return any(isinstance(c, dict | list) for c in level)


async def _read(request: web.Request) -> bytes:
    """The body, refused with 413 as soon as it passes MAX_BODY_BYTES (declared or counted):
    content.read(n) answers what has come so far, so it is read to its end here."""
    too_large = f"the body is larger than {MAX_BODY_BYTES} bytes, SCIM's limit"
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        fail(413, too_large)
    body = bytearray()
    try:
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                fail(413, too_large)
    except HttpProcessingError as e:  # a stalled upload (408), a broken chunked encoding
        if e.code == 408:
            fail(408, "the upload stalled")
        fail(400, "the body could not be read", "invalidSyntax")
    except ConnectionError:
        fail(400, "the client left before the body was sent", "invalidSyntax")
    return bytes(body)
