"""SCIM's /Users over the people directory: a user's userName, active flag, primary email and
externalId are the directory's (their first OIDC sign-in links by externalId); the attributes
kept as given (name, displayName, emails, externalId) lie beside it under /people/scim/users/.
Deactivating a user stops their keys at once; a DELETE deactivates and hides the user (its id
is never reused, its name stays taken)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from llmgwd.people.directory import SCIM_USERS, Directory
from llmgwd.people.records import User
from llmgwd.people.rules import PeopleError
from llmgwd.scim import bounds, query
from llmgwd.scim.base import USER, Doc, answer, ctx, fail, read_doc
from llmgwd.scim.discovery import USER_ATTRS
from llmgwd.scim.patch import apply
from llmgwd.store import prefix_end

SIDE = SCIM_USERS  # + a user's id: the SCIM attributes kept beside the directory's
PREFIX = "/scim/v2"
NAMES = [str(a["name"]) for a in USER_ATTRS] + ["externalId"]
EXTRA = ("name", "displayName", "emails", "externalId")  # kept in the side record


def when(t: float) -> str:
    """A time as SCIM writes it (RFC 3339)."""
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def base(request: web.Request) -> str:
    """Where SCIM is served, for meta.location."""
    return f"{request.url.origin()}{PREFIX}"


def _dir(request: web.Request) -> Directory:
    return Directory(ctx(request).catalog.store)


async def _side(request: web.Request, user_id: str) -> Doc:
    kv = await ctx(request).catalog.store.get(SIDE + user_id)
    return dict(json.loads(kv.value)) if kv is not None else {}


def view(request: web.Request, user: User, side: Doc) -> Doc:
    """A user as SCIM shows them."""
    doc: Doc = {"schemas": [USER], "id": user.id, "userName": side.get("userName", user.name)}
    doc |= {k: side[k] for k in EXTRA if side.get(k) is not None}
    if not user.active or side.get("shows_active", True):
        doc["active"] = user.active  # left out only while active and removed by a PATCH
    doc["meta"] = {
        "resourceType": "User",
        "created": when(user.created_at),
        "lastModified": when(float(side.get("modified", user.created_at))),
        "location": f"{base(request)}/Users/{user.id}",
    }
    return doc


def _email(doc: Doc) -> str:
    emails = [e for e in doc.get("emails") or [] if isinstance(e, dict) and e.get("value")]
    primary = [e for e in emails if e.get("primary") is True] or emails
    return str(primary[0]["value"]) if primary else ""


def _active(doc: Doc) -> bool:
    value: Any = doc.get("active", True)
    return value.lower() == "true" if isinstance(value, str) else bool(value)


def _external_id(doc: Doc) -> str:
    """The identity provider's id for the person (their OIDC sign-in links by it)."""
    value = doc.get("externalId")
    if value is not None and not isinstance(value, str):
        fail(400, "externalId: must be a string", "invalidValue")
    return value or ""


def _user_name(doc: Doc) -> str:
    name = doc.get("userName")
    if not isinstance(name, str) or not name.strip():
        fail(400, "userName: required", "invalidValue")
    return name.strip()


async def _found(request: web.Request) -> tuple[User, Doc]:
    ident = request.match_info["id"]
    user = await _dir(request).user(ident) if len(ident) == 12 else None
    side = await _side(request, user.id) if user is not None else {}
    if user is None or side.get("deleted"):
        fail(404, f"no user {ident!r}")
    return user, side


async def _save(
    request: web.Request, user: User, doc: Doc, deleted: bool = False, patched: bool = False
) -> User:
    """doc's attributes kept: the directory's (active, email) and the side record's (active
    is shown unless a PATCH removed it: the user stays active then)."""
    try:
        if user.name != _user_name(doc).lower():
            user = await _dir(request).rename_user(user.id, _user_name(doc).lower())
        user = await _dir(request).change_user(
            user.id, active=_active(doc), email=_email(doc), external_id=_external_id(doc)
        )
    except PeopleError as e:
        conflict = e.kind == "conflict"
        fail(409 if conflict else 400, str(e), "uniqueness" if conflict else "invalidValue")
    ctx(request).catalog.note_user(user)  # a deactivated user's keys stop here at once
    side = {k: doc[k] for k in EXTRA if doc.get(k) is not None}
    side |= {"userName": _user_name(doc), "modified": time.time(), "deleted": deleted,
             "shows_active": not patched or "active" in doc}  # fmt: skip
    await ctx(request).catalog.store.put(SIDE + user.id, json.dumps(side).encode())
    return user


async def docs(request: web.Request) -> list[Doc]:
    """Every user not deleted, as SCIM shows them."""
    store = ctx(request).catalog.store
    kvs, _ = await store.range(SIDE, prefix_end(SIDE))
    sides = {kv.key[len(SIDE) :]: dict(json.loads(kv.value)) for kv in kvs}
    users = await _dir(request).users()
    return [view(request, u, sides.get(u.id, {})) for u in users
            if not sides.get(u.id, {}).get("deleted")]  # fmt: skip


async def list_users(request: web.Request) -> web.Response:
    """GET /Users[?filter=userName eq "x"&startIndex&count&attributes], POST /Users/.search"""
    return answer(query.listed(await query.params(request), await docs(request), NAMES))


async def create_user(request: web.Request) -> web.Response:
    """POST /Users: a user (source scim), 409 uniqueness for a name taken."""
    doc = bounds.user(await read_doc(request))
    name = _user_name(doc).lower()
    try:
        user = await _dir(request).create_user(name, _email(doc), "scim", _external_id(doc))
    except PeopleError as e:
        fail(409 if e.kind == "conflict" else 400, str(e),
             "uniqueness" if e.kind == "conflict" else "invalidValue")  # fmt: skip
    user = await _save(request, user, doc)
    out = view(request, user, await _side(request, user.id))
    response = answer(query.shaped(request.query, out, NAMES), 201)
    response.headers["Location"] = out["meta"]["location"]
    return response


async def get_user(request: web.Request) -> web.Response:
    """GET /Users/{id}"""
    user, side = await _found(request)
    return answer(query.shaped(request.query, view(request, user, side), NAMES))


async def replace_user(request: web.Request) -> web.Response:
    """PUT /Users/{id}: every attribute as given (one left out is removed)."""
    user, _ = await _found(request)
    user = await _save(request, user, bounds.user(await read_doc(request)))
    out = view(request, user, await _side(request, user.id))
    return answer(query.shaped(request.query, out, NAMES))


async def patch_user(request: web.Request) -> web.Response:
    """PATCH /Users/{id}: a PatchOp (`active` false deactivates, and the keys stop)."""
    user, side = await _found(request)
    doc = bounds.user(apply(view(request, user, side), await read_doc(request), NAMES))
    user = await _save(request, user, doc, patched=True)
    out = view(request, user, await _side(request, user.id))
    return answer(query.shaped(request.query, out, NAMES))


async def delete_user(request: web.Request) -> web.Response:
    """DELETE /Users/{id}: deactivated (keys stop) and gone from SCIM."""
    user, side = await _found(request)
    doc = view(request, user, side) | {"active": False}
    await _save(request, user, doc, deleted=True)
    return web.Response(status=204)
