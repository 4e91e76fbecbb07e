"""The console's people page (/console/people): users, their staff roles and limits, the
organizations (each on its own page), the admin keys, the person's own keys and SCIM and OIDC
state, read through /api/v1 as the signed-in person; its forms that make a key (or the SCIM token)
go to POST /console/made (console.made), which shows the secret on that answer only."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from aiohttp import web

from llmgw.api_types import KeyView, LevelView, OrgView, PersonKeyView, UserView
from llmgwd.console.base import PREFIX, Person, render
from llmgwd.console.forms import Drawn, Field, Form
from llmgwd.console.org_page import KEY_MAKING, LIMITS, MADE, drawn, limit_values, readable, select
from llmgwd.console.pages import read
from llmgwd.console.signin import required

PAGE = PREFIX + "/people"
_USER = "/users/{user}"
_TEXT = "text"

# The page's own forms: a user, an organization.
PEOPLE_FORMS: tuple[Form, ...] = (
    Form(
        "POST",
        "/users",
        "Add user",
        (
            Field("body.name", "Name", _TEXT),
            Field("body.email", "Email", "email"),
            Field("body.external_id", "Identity provider's id", _TEXT),
        ),
    ),
    Form(
        "POST",
        "/orgs",
        "Add organization",
        (Field("body.name", "Name", _TEXT), Field("body.title", "Title", _TEXT)),
    ),
)
# Each user's forms: what they are, their staff role, their limits, their removal.
USER_FORMS: tuple[Form, ...] = (
    Form(
        "PATCH",
        _USER,
        "Change",
        (
            Field("body.email", "Email", "email"),
            Field("body.active", "Active", select("true", "false"), "true"),
            Field("body.external_id", "Identity provider's id", _TEXT),
        ),
    ),
    Form(
        "PUT",
        _USER + "/staff",
        "Set staff role",
        (Field("body.role", "Staff role", select("viewer", "operator", "admin"), "viewer"),),
    ),
    Form("PATCH", _USER + "/limits", "Set limits", LIMITS),
    Form("DELETE", _USER, "Delete user", danger=True),
)
# A user waiting for staff's approval (oidc.approval_required) has this form first.
APPROVE = Form("POST", _USER + "/approve", "Approve")
# Sent to POST /console/made: their answers hold a secret, shown there once.
PEOPLE_MAKING: tuple[Form, ...] = (
    Form(
        "POST",
        "/keys",
        "Make an admin-made key",
        (
            Field("body.name", "Key name", _TEXT),
            Field("body.role", "Role", select("user", "admin"), "user"),
        ),
    ),
    Form("POST", "/me/keys", "Make my key", (Field("body.name", "Key name", _TEXT),)),
    Form("POST", "/scim/token", "New SCIM token (the old one stops)", danger=True),
)
KEY_FORMS: tuple[Form, ...] = (
    Form("PATCH", "/keys/{key}/limits", "Set limits", LIMITS),
    Form("DELETE", "/keys/{key}", "Revoke", danger=True),
)
MY_KEY_FORMS: tuple[Form, ...] = (Form("DELETE", "/me/keys/{key}", "Revoke", danger=True),)
FORMS: tuple[Form, ...] = (
    *PEOPLE_FORMS,
    APPROVE,
    *USER_FORMS,
    *PEOPLE_MAKING,
    *KEY_FORMS,
    *MY_KEY_FORMS,
)
MAKING: tuple[Form, ...] = (*PEOPLE_MAKING, *KEY_MAKING)


@dataclass(slots=True)
class Row:
    """A user, an admin key or one of the person's keys, with its limits and forms."""

    view: UserView | KeyView | PersonKeyView
    forms: list[Drawn]
    limits: LevelView | None = None


@dataclass(slots=True)
class PeoplePage:
    """All the people page shows; None: the person may not read that part."""

    forms: list[Drawn]
    making: list[Drawn]
    users: list[Row] | None
    orgs: list[OrgView]
    keys: list[Row] | None
    mine: list[Row]
    sources: dict[str, int]  # users by where they come from: staff, oidc, scim
    waiting: int = 0  # users waiting for staff's approval


async def _users(request: web.Request, person: Person) -> list[Row] | None:
    users = await readable(request, person, "/users")
    if not isinstance(users, list):
        return None
    out = []
    for u in users:
        limits = await readable(request, person, _USER + "/limits", {"user": u.id})
        level = limits if isinstance(limits, LevelView) else None
        values = {
            **limit_values(level.limits if level else None),
            "body.email": u.email,
            "body.active": "true" if u.active else "false",
            "body.external_id": u.external_id,
        }
        forms = USER_FORMS if u.approved else (APPROVE, *USER_FORMS)
        out.append(Row(u, await drawn(request, person, forms, {"user": u.id}, values), level))
    return out


async def _keys(request: web.Request, person: Person) -> list[Row] | None:
    """The keys POST /keys made (GET /keys), where the person may read them."""
    keys = await readable(request, person, "/keys")
    if not isinstance(keys, list):
        return None
    out = []
    for k in keys:
        live = () if k.revoked else KEY_FORMS
        got = await drawn(request, person, live, {"key": k.id}, limit_values(k.limits))
        out.append(Row(k, got))
    return out


async def people_of(request: web.Request, person: Person) -> PeoplePage:
    """The people page as this person may read it."""
    users = await _users(request, person)
    mine: list[PersonKeyView] = await read(request, person, "/me/keys")
    return PeoplePage(
        forms=await drawn(request, person, PEOPLE_FORMS, {}),
        making=await drawn(request, person, PEOPLE_MAKING, {}),
        users=users,
        orgs=await read(request, person, "/orgs"),
        keys=await _keys(request, person),
        mine=[
            Row(k, [] if k.revoked else await drawn(request, person, MY_KEY_FORMS, {"key": k.id}))
            for k in mine
        ],
        sources=dict(Counter(r.view.source for r in users or [] if isinstance(r.view, UserView))),
        waiting=sum(1 for r in users or [] if isinstance(r.view, UserView) and not r.view.approved),
    )


async def people_page(request: web.Request) -> web.Response:
    """GET /console/people"""
    person = required(request)
    data = await people_of(request, person)
    return render(request, "people.html", person, page="people", p=data, back=PAGE, made=MADE)
