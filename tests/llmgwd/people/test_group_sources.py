"""OIDC's groups and SCIM's groups mapped by the same rules: each source adds and takes away
only the memberships its own groups gave, so a SCIM sync never undoes a sign-in's and back;
a role set by hand is touched by neither."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from llmgw.config import GroupRule, Oidc
from llmgwd.people.directory import Directory
from llmgwd.people.records import Scope, User
from llmgwd.people.signin import SignIn
from llmgwd.store.sqlite import SqliteStore

RULES = (
    GroupRule(group="ml", org="acme", role="member"),
    GroupRule(group="ml-leads", org="acme", role="manager"),
    GroupRule(group="chat", org="acme", project="chat", role="member"),
)
ACME = Scope(org="acme")


@pytest.fixture
async def site() -> AsyncIterator[tuple[SignIn, Directory, User]]:
    store = await SqliteStore.open(":memory:")
    people = Directory(store)
    await people.create_org("acme")
    await people.create_project("acme", "chat")
    user = await people.create_user("ada")
    yield SignIn(store, Oidc(rules=RULES)), people, user
    await store.close()


async def test_a_scim_sync_keeps_what_a_sign_in_gave_and_back(
    site: tuple[SignIn, Directory, User],
) -> None:
    groups, people, ada = site
    await groups.apply_groups(ada, {"ml"}, "oidc")  # the token says ml
    await groups.apply_groups(ada, set(), "scim")  # the SCIM groups do not list her
    assert await people.role_in(ada.id, "acme") == "member"
    await groups.apply_groups(ada, {"chat"}, "scim")  # SCIM's chat, then a sign-in without it
    await groups.apply_groups(ada, {"ml"}, "oidc")
    assert {m.scope.kind for m in await people.members("acme")} == {"org", "project"}
    await groups.apply_groups(ada, set(), "scim")  # SCIM's own goes, the sign-in's stays
    assert [m.scope for m in await people.members("acme")] == [ACME]


async def test_the_strongest_source_holds_and_each_takes_back_only_its_own(
    site: tuple[SignIn, Directory, User],
) -> None:
    groups, people, ada = site
    await groups.apply_groups(ada, {"ml"}, "oidc")
    await groups.apply_groups(ada, {"ml-leads"}, "scim")
    assert await people.role_in(ada.id, "acme") == "manager"
    await groups.apply_groups(ada, {"ml"}, "oidc")  # a sign-in again: SCIM's manager stays
    assert await people.role_in(ada.id, "acme") == "manager"
    await groups.apply_groups(ada, set(), "scim")  # SCIM's gone: the sign-in's member left
    (m,) = await people.members("acme")
    assert (m.role, m.set_by, dict(m.sources)) == ("member", "group", {"oidc": "member"})
    await groups.apply_groups(ada, set(), "oidc")
    assert await people.members("acme") == []


async def test_a_role_set_by_hand_is_touched_by_neither_source(
    site: tuple[SignIn, Directory, User],
) -> None:
    groups, people, ada = site
    await people.set_member("", ada.id, ACME, "admin")
    for source in ("oidc", "scim"):
        await groups.apply_groups(ada, {"ml"}, source)
        await groups.apply_groups(ada, set(), source)
    (m,) = await people.members("acme")
    assert (m.role, m.set_by) == ("admin", "hand")
