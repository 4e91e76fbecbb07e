"""SCIM's /Groups: an identity provider's groups, kept under /people/scim/groups/, each turned
into memberships by the settings' group rules (oidc.rules, as at sign-in: set by the group, a
role set by hand never rewritten, one of a group left removed)."""

from __future__ import annotations

import json
import secrets
import time

from aiohttp import web

from llmgw.config import Oidc
from llmgwd.people.directory import ROOT, Directory
from llmgwd.people.signin import SignIn
from llmgwd.scim import bounds, query
from llmgwd.scim.base import GROUP, Doc, answer, ctx, fail, read_doc
from llmgwd.scim.discovery import GROUP_ATTRS
from llmgwd.scim.patch import apply
from llmgwd.scim.users import base, when
from llmgwd.store import prefix_end

GROUPS = ROOT + "scim/groups/"  # + the group's id
NAMES = [str(a["name"]) for a in GROUP_ATTRS] + ["externalId"]


async def _all(request: web.Request) -> list[Doc]:
    store = ctx(request).catalog.store
    kvs, _ = await store.range(GROUPS, prefix_end(GROUPS))
    return [dict(json.loads(kv.value)) for kv in kvs]


def view(request: web.Request, group: Doc) -> Doc:
    """A group as SCIM shows it."""
    doc: Doc = {"schemas": [GROUP], "id": group["id"], "displayName": group["displayName"]}
    doc |= {k: group[k] for k in ("externalId", "members") if group.get(k) is not None}
    doc["meta"] = {
        "resourceType": "Group",
        "created": when(group["created"]),
        "lastModified": when(group["modified"]),
        "location": f"{base(request)}/Groups/{group['id']}",
    }
    return doc


def _members(doc: Doc) -> set[str]:
    return {str(m.get("value")) for m in doc.get("members") or [] if isinstance(m, dict)}


async def _apply_rules(request: web.Request, users: set[str]) -> None:
    """Each of these users' memberships by the rules, from the groups they are in now."""
    c = ctx(request)
    if not c.rules:
        return
    groups = await _all(request)
    signin = SignIn(c.catalog.store, Oidc(rules=c.rules))
    people = Directory(c.catalog.store)
    for uid in sorted(users):
        user = await people.user(uid) if len(uid) == 12 else None
        if user is not None:
            held = {str(g["displayName"]) for g in groups if uid in _members(g)}
            await signin.apply_groups(user, held, "scim")


async def _save(request: web.Request, doc: Doc, old: Doc | None) -> Doc:
    name = str(bounds.group(doc)["displayName"])
    people = Directory(ctx(request).catalog.store)
    members = []
    for m in doc.get("members") or []:
        uid = str(m.get("value", "")) if isinstance(m, dict) else ""
        user = await people.user(uid) if len(uid) == 12 else None
        if user is None:
            fail(400, f"members: no user {uid!r}", "invalidValue")
        member = {"value": user.id, "$ref": f"{base(request)}/Users/{user.id}"}
        members.append(member | ({"display": m["display"]} if m.get("display") else {}))
    now = time.time()
    group: Doc = {
        "id": old["id"] if old else secrets.token_hex(6),
        "displayName": name.strip(),
        "members": members,
        "created": old["created"] if old else now,
        "modified": now,
    }
    if doc.get("externalId") is not None:
        group["externalId"] = doc["externalId"]
    await ctx(request).catalog.store.put(GROUPS + group["id"], json.dumps(group).encode())
    await _apply_rules(request, _members(group) | (_members(old) if old else set()))
    return group  # fmt: skip


async def _found(request: web.Request) -> Doc:
    ident = request.match_info["id"]
    kv = await ctx(request).catalog.store.get(GROUPS + ident) if "/" not in ident else None
    if kv is None:
        fail(404, f"no group {ident!r}")
    return dict(json.loads(kv.value))


async def docs(request: web.Request) -> list[Doc]:
    """Every group, as SCIM shows them."""
    return [view(request, g) for g in await _all(request)]


async def list_groups(request: web.Request) -> web.Response:
    """GET /Groups[?filter=displayName eq "x"], POST /Groups/.search"""
    return answer(query.listed(await query.params(request), await docs(request), NAMES))


async def create_group(request: web.Request) -> web.Response:
    """POST /Groups"""
    doc = bounds.group(await read_doc(request))
    name = doc.get("displayName")
    if any(g["displayName"] == name for g in await _all(request)):
        fail(409, f"a group named {name!r} exists", "uniqueness")
    out = view(request, await _save(request, doc, None))
    response = answer(query.shaped(request.query, out, NAMES), 201)
    response.headers["Location"] = out["meta"]["location"]
    return response


async def get_group(request: web.Request) -> web.Response:
    """GET /Groups/{id}"""
    return answer(query.shaped(request.query, view(request, await _found(request)), NAMES))


async def replace_group(request: web.Request) -> web.Response:
    """PUT /Groups/{id}"""
    old = await _found(request)
    out = view(request, await _save(request, await read_doc(request), old))
    return answer(query.shaped(request.query, out, NAMES))


async def patch_group(request: web.Request) -> web.Response:
    """PATCH /Groups/{id}: members added or removed (`members[value eq "ID"]`), renamed."""
    old = await _found(request)
    doc = apply(view(request, old), await read_doc(request), NAMES)
    out = view(request, await _save(request, doc, old))
    return answer(query.shaped(request.query, out, NAMES))


async def delete_group(request: web.Request) -> web.Response:
    """DELETE /Groups/{id}: its members' memberships by it go."""
    old = await _found(request)
    await ctx(request).catalog.store.delete(GROUPS + old["id"])
    await _apply_rules(request, _members(old))
    return web.Response(status=204)
