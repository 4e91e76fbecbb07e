"""SCIM's own answers: its media type, its error body, the bearer token's check and the app's
context (the catalog, whose active users stop keys, and the settings' group rules)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web
from aiohttp.typedefs import Handler

from llmgw.config import GroupRule
from llmgwd.catalog import Catalog
from llmgwd.scim import token
from llmgwd.stored_token import bearer

log = logging.getLogger(__name__)

MEDIA = "application/scim+json"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
LIST = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
SEARCH = "urn:ietf:params:scim:api:messages:2.0:SearchRequest"
PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
MAX_BODY_BYTES = 1024 * 1024

Doc = dict[str, Any]


@dataclass(frozen=True)
class ScimContext:
    """What the SCIM routes use: the catalog (and its store) and the group rules."""

    catalog: Catalog
    rules: tuple[GroupRule, ...] = ()


CTX = web.AppKey("llmgw.scim", ScimContext)


class ScimError(Exception):
    """An error answer in SCIM's shape; the detail is shown (it names no secret)."""

    def __init__(self, status: int, detail: str, scim_type: str = "") -> None:
        super().__init__(detail)
        self.status, self.detail, self.scim_type = status, detail, scim_type


def fail(status: int, detail: str, scim_type: str = "") -> NoReturn:
    """Raise a SCIM error."""
    raise ScimError(status, detail, scim_type)


def answer(doc: Doc, status: int = 200) -> web.Response:
    """A SCIM document as the answer."""
    return web.Response(status=status, text=json.dumps(doc), content_type=MEDIA)


def error_answer(e: ScimError) -> web.Response:
    """RFC 7644 3.12's error body."""
    doc: Doc = {"schemas": [ERROR], "status": str(e.status), "detail": e.detail}
    if e.scim_type:
        doc["scimType"] = e.scim_type
    headers = {"WWW-Authenticate": 'Bearer realm="llmgw-scim"'} if e.status == 401 else None
    response = answer(doc, e.status)
    response.headers.update(headers or {})
    return response


def ctx(request: web.Request) -> ScimContext:
    """The SCIM app's context."""
    return request.config_dict[CTX]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error in SCIM's shape: the handlers', aiohttp's (404, 405), and the unexpected."""
    try:
        return await handler(request)
    except ScimError as e:
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
    """The request's JSON object (RFC 7644: application/scim+json or application/json)."""
    raw = await request.content.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        fail(413, f"the body is larger than {MAX_BODY_BYTES} bytes", "tooMany")
    try:
        doc = json.loads(raw)
    except ValueError:
        fail(400, "the body is not JSON", "invalidSyntax")
    if not isinstance(doc, dict):
        fail(400, "the body is not a JSON object", "invalidSyntax")
    return doc
