"""A first OIDC sign-in of a person made by staff or provisioned by SCIM is that user, found by
their external id (the token's link claim, by default sub); never by a name or an email, never
a user already linked to another person, never a guess between two."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llmgw.config import Oidc
from llmgwd.people.directory import Directory
from llmgwd.people.oidc import SignInError
from llmgwd.people.rules import PeopleError
from llmgwd.people.signin import SignIn
from llmgwd.store import Store
from llmgwd.store.sqlite import SqliteStore

ISSUER = "https://idp.example"


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    opened = await SqliteStore.open(":memory:")
    yield opened
    await opened.close()


def sign_in(store: Store, **settings: Any) -> SignIn:
    return SignIn(store, Oidc(issuer=ISSUER, client_id="llmgw", **settings))


def claims(sub: str, name: str, **more: Any) -> dict[str, Any]:
    return {"sub": sub, "preferred_username": name, **more}


async def refused(signin: SignIn, token: dict[str, Any]) -> SignInError:
    with pytest.raises(SignInError) as e:
        await signin.user_for(token)
    return e.value


async def test_a_user_provisioned_by_scim_signs_in_as_themselves(store: Store) -> None:
    people = Directory(store)
    bea = await people.create_user("bea", source="scim", external_id="00u1bea")
    signin = sign_in(store)
    for _ in range(2):  # the first sign-in links; the second finds the link
        user = await signin.user_for(claims("00u1bea", "bea", email="bea@uni.example"))
        assert (user.id, user.source, user.email) == (bea.id, "scim", "bea@uni.example")
    assert [u.id for u in await people.users()] == [bea.id]


async def test_a_user_made_by_staff_is_found_by_id_not_by_their_name(store: Store) -> None:
    people = Directory(store)
    made = await people.create_user("b.lovelace", external_id="sub-7")
    user = await sign_in(store).user_for(claims("sub-7", "bea"))
    assert user.id == made.id and user.name == "b.lovelace"


async def test_a_name_or_an_email_never_takes_over_a_user(store: Store) -> None:
    people = Directory(store)
    await people.create_user("bea", email="bea@uni.example")  # staff's, no external id
    signin = sign_in(store)
    e = await refused(signin, claims("sub-x", "bea", email="bea@uni.example"))
    assert (e.status, e.code) == (409, "name_taken")
    assert "external_id" in str(e)  # says what staff can do
    other = await signin.user_for(claims("sub-y", "bea2", email="bea@uni.example"))
    assert other.source == "oidc" and other.name == "bea2"  # a new user, not staff's bea


async def test_a_linked_user_is_never_linked_to_another_person(store: Store) -> None:
    people = Directory(store)
    bea = await people.create_user("bea", source="scim", external_id="sub-bea")
    signin = sign_in(store)
    await signin.user_for(claims("sub-bea", "bea"))
    await people.change_user(bea.id, external_id="sub-eve")  # a mistake, or a trick
    e = await refused(signin, claims("sub-eve", "eve"))
    assert (e.status, e.code) == (409, "user_linked")
    assert (await signin.user_for(claims("sub-bea", "bea"))).id == bea.id  # still Bea's


async def test_two_users_with_the_sign_in_s_external_id_are_not_guessed_between(
    store: Store,
) -> None:
    people = Directory(store)
    one = await people.create_user("bea", external_id="sub-bea")
    two = await people.create_user("bea-old", source="scim", external_id="sub-bea")
    signin = sign_in(store)
    e = await refused(signin, claims("sub-bea", "bea"))
    assert (e.status, e.code) == (409, "external_id_ambiguous") and "bea, bea-old" in str(e)
    await people.change_user(two.id, external_id="")
    assert (await signin.user_for(claims("sub-bea", "bea"))).id == one.id


async def test_the_link_claim_is_the_settings_and_empty_turns_linking_off(store: Store) -> None:
    people = Directory(store)
    bea = await people.create_user("bea", source="scim", external_id="obj-1")
    token = claims("pairwise-sub", "bea", oid="obj-1")  # Entra: oid is the object id
    e = await refused(sign_in(store, link_claim=""), token)
    assert e.code == "name_taken"
    e = await refused(sign_in(store), token)  # sub is not obj-1
    assert e.code == "name_taken"
    assert (await sign_in(store, link_claim="oid").user_for(token)).id == bea.id


async def test_a_user_who_signed_in_is_not_linked_again_by_an_id_set_later(
    store: Store,
) -> None:
    signin = sign_in(store)
    ada = await signin.user_for(claims("sub-ada", "ada"))
    await Directory(store).change_user(ada.id, external_id="sub-mal")
    mal = await signin.user_for(claims("sub-mal", "mal"))
    assert mal.id != ada.id and mal.source == "oidc"


async def test_two_first_sign_ins_at_once_are_the_same_user(store: Store) -> None:
    bea = await Directory(store).create_user("bea", source="scim", external_id="sub-bea")
    signin = sign_in(store)
    users = await asyncio.gather(*(signin.user_for(claims("sub-bea", "bea")) for _ in range(8)))
    assert {u.id for u in users} == {bea.id}


async def test_a_deactivated_user_is_linked_but_refused(store: Store) -> None:
    people = Directory(store)
    bea = await people.create_user("bea", source="scim", external_id="sub-bea")
    await people.change_user(bea.id, active=False)
    e = await refused(sign_in(store), claims("sub-bea", "bea"))
    assert (e.status, e.code) == (403, "user_deactivated")


async def test_a_deleted_user_s_external_id_links_the_next_one(store: Store) -> None:
    people = Directory(store)
    signin = sign_in(store)
    old = await people.create_user("bea", external_id="sub-bea")
    await signin.user_for(claims("sub-bea", "bea"))
    await people.delete_user(old.id)
    new = await people.create_user("bea2", source="scim", external_id="sub-bea")
    assert (await signin.user_for(claims("sub-bea", "bea"))).id == new.id


async def test_an_external_id_is_checked(store: Store) -> None:
    people = Directory(store)
    for bad in (" padded", "x" * 257, "tab\there"):
        with pytest.raises(PeopleError, match="external_id"):
            await people.create_user("bea", external_id=bad)
