"""The people model's rules alone: names, ranks, a group against a hand, one's own admin role."""

from __future__ import annotations

import pytest

from llmgwd.people import rules
from llmgwd.people.records import MemberRole, Membership, Scope
from llmgwd.people.rules import PeopleError

ORG = Scope(org="acme")


def _m(role: str, set_by: str = "hand", user: str = "u1", scope: Scope = ORG) -> Membership:
    return Membership(user=user, scope=scope, role=role, set_by=set_by)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["acme", "a", "physics-dept", "t.1_x", "0" * 64])
def test_good_names_pass(name: str) -> None:
    assert rules.check_name("name", name) == name


@pytest.mark.parametrize("name", ["", "Acme", "-acme", "a/b", "a b", "é", "x" * 65, "a\n"])
def test_bad_names_are_refused_naming_the_field(name: str) -> None:
    with pytest.raises(PeopleError) as e:
        rules.check_name("name", name)
    assert e.value.kind == "invalid" and e.value.param == "name"


def test_emails_and_titles_are_checked() -> None:
    assert rules.check_email("") == "" and rules.check_email("a@b.org") == "a@b.org"
    for bad in ("ab.org", "a@b@c", "a b@c"):
        with pytest.raises(PeopleError):
            rules.check_email(bad)
    with pytest.raises(PeopleError):
        rules.check_title("x\n")


def test_roles_rank_member_manager_admin() -> None:
    assert rules.rank(None) < rules.rank("member") < rules.rank("manager") < rules.rank("admin")


def test_a_group_never_rewrites_a_role_set_by_hand() -> None:
    assert rules.merged(_m("manager"), _m("member", "group")) is None
    assert rules.merged(_m("manager"), _m("admin", "group")) is None


def test_a_group_rewrites_a_group_role_and_a_hand_rewrites_anything() -> None:
    assert rules.merged(_m("member", "group"), _m("manager", "group")) == _m("manager", "group")
    assert rules.merged(_m("manager", "group"), _m("member")) == _m("member")
    assert rules.merged(None, _m("member", "group")) == _m("member", "group")


def test_an_org_admin_cannot_take_their_own_admin_role_away() -> None:
    roles: list[MemberRole | None] = ["manager", "member", None]
    for role in roles:
        with pytest.raises(PeopleError) as e:
            rules.check_not_own_admin("u1", _m("admin"), role)
        assert e.value.kind == "forbidden"


def test_another_may_and_a_team_admin_may_step_down() -> None:
    rules.check_not_own_admin("u2", _m("admin"), "member")
    rules.check_not_own_admin("", _m("admin"), None)  # staff, or a key
    rules.check_not_own_admin("u1", _m("admin"), "admin")
    team = Scope(org="acme", kind="team", name="t")
    rules.check_not_own_admin("u1", _m("admin", scope=team), "member")


def test_two_sources_of_groups_each_keep_their_own_role() -> None:
    oidc = Membership(
        user="u1", scope=ORG, role="member", set_by="group", sources={"oidc": "member"}
    )
    scim = Membership(
        user="u1", scope=ORG, role="manager", set_by="group", sources={"scim": "manager"}
    )
    both = rules.merged(oidc, scim)
    assert both is not None and both.role == "manager"
    assert dict(both.sources) == {"oidc": "member", "scim": "manager"}
    left = rules.without(both, "scim")
    assert left is not None and (left.role, dict(left.sources)) == ("member", {"oidc": "member"})
    assert rules.without(left, "oidc") is None
