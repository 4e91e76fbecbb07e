"""The people directory over both store backends (SQLite, and a real etcd member when etcd is
installed): what a user of the API would check, and two changes at once both kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llmgwd.people.directory import Directory
from llmgwd.people.records import Scope
from llmgwd.people.rules import PeopleError
from llmgwd.store import Store, prefix_end
from llmgwd.store.etcd import EtcdStore
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.store import local_etcd

ACME = Scope(org="acme")


@pytest.fixture(scope="module")
def etcd_member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_etcd.Member | None]:
    if not local_etcd.ETCD.exists():
        yield None
        return
    with local_etcd.cluster(tmp_path_factory.mktemp("etcd")) as members:
        yield members[0]


@pytest.fixture(params=["sqlite", "etcd"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, etcd_member: local_etcd.Member | None
) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        opened: Store = await SqliteStore.open(str(tmp_path / "s.db"))
    elif etcd_member is None:
        pytest.skip("etcd is not installed (/usr/bin/etcd: apt install etcd-server)")
    else:
        m = etcd_member
        opened = await EtcdStore.open(
            m.endpoint, ca_file=m.ca_file, cert_file=m.cert_file, key_file=m.key_file
        )
        await opened.delete("", prefix_end(""))
    yield opened
    await opened.close()


@pytest.fixture
async def people(store: Store) -> Directory:
    d = Directory(store)
    await d.create_org("acme", "ACME Corp")
    return d


async def test_an_org_with_teams_projects_and_members(people: Directory) -> None:
    await people.create_team("acme", "ml")
    await people.create_project("acme", "chat", team="ml")
    await people.create_project("acme", "ops")
    ann = await people.create_user("ann", "ann@acme.org")
    await people.set_member("", ann.id, Scope(org="acme", kind="team", name="ml"), "manager")
    assert [t.name for t in await people.teams("acme")] == ["ml"]
    assert [(p.name, p.team) for p in await people.projects("acme")] == [
        ("chat", "ml"),
        ("ops", ""),
    ]
    assert await people.role_in(ann.id, "acme", team="ml") == "manager"
    assert await people.role_in(ann.id, "acme") is None  # a team's manager, not the org's
    assert await people.user("ann") == ann and await people.user(ann.id) == ann


async def test_names_are_unique_and_parents_must_exist(people: Directory) -> None:
    await people.create_user("bob")
    for make in (
        people.create_org("acme"),
        people.create_user("bob"),
    ):
        with pytest.raises(PeopleError) as e:
            await make
        assert e.value.kind == "conflict"
    for missing in (
        people.create_team("nope", "t"),
        people.create_project("acme", "p", team="nope"),
        people.set_member("", "000000000000", ACME, "member"),
    ):
        with pytest.raises(PeopleError) as e:
            await missing
        assert e.value.kind == "not_found"


async def test_a_group_rule_keeps_a_manager_set_by_hand(people: Directory) -> None:
    ann = await people.create_user("ann")
    await people.set_member("", ann.id, ACME, "manager")
    kept = await people.set_member("", ann.id, ACME, "member", set_by="group", group="staff")
    assert kept.role == "manager" and kept.set_by == "hand"
    assert not await people.remove_member("", ann.id, ACME, set_by="group")
    assert await people.role_in(ann.id, "acme") == "manager"


async def test_an_org_admin_cannot_demote_themselves_but_another_admin_can(
    people: Directory,
) -> None:
    ann, bob = await people.create_user("ann"), await people.create_user("bob")
    await people.set_member("", ann.id, ACME, "admin")
    with pytest.raises(PeopleError):
        await people.set_member(ann.id, ann.id, ACME, "member")
    with pytest.raises(PeopleError):
        await people.remove_member(ann.id, ann.id, ACME)
    assert await people.role_in(ann.id, "acme") == "admin"
    await people.set_member(bob.id, ann.id, ACME, "member")
    assert await people.role_in(ann.id, "acme") == "member"


async def test_deleting_an_org_takes_everything_in_it(people: Directory) -> None:
    ann = await people.create_user("ann")
    await people.create_team("acme", "ml")
    await people.create_project("acme", "chat", team="ml")
    await people.set_member("", ann.id, ACME, "admin")
    await people.delete_org("acme")
    assert await people.orgs() == [] and await people.teams("acme") == []
    assert await people.projects("acme") == [] and await people.members("acme") == []
    assert await people.user("ann") == ann  # users are the cluster's, not an org's


async def test_a_team_with_a_project_is_not_deleted(people: Directory) -> None:
    await people.create_team("acme", "ml")
    await people.create_project("acme", "chat", team="ml")
    with pytest.raises(PeopleError) as e:
        await people.delete_team("acme", "ml")
    assert e.value.kind == "conflict"
    await people.delete_project("acme", "chat")
    await people.delete_team("acme", "ml")
    assert await people.teams("acme") == []


async def test_staff_roles(people: Directory) -> None:
    ann = await people.create_user("ann")
    await people.set_staff(ann.id, "operator")
    assert await people.staff_role(ann.id) == "operator"
    await people.set_staff(ann.id, None)
    assert await people.staff_role(ann.id) is None


# Two changes at once: both kept, or exactly one refused, never one lost.


async def test_two_changes_to_one_user_at_once_are_both_kept(people: Directory) -> None:
    ann = await people.create_user("ann")
    await asyncio.gather(
        people.change_user(ann.id, email="ann@acme.org"), people.change_user(ann.id, active=False)
    )
    now = await people.user(ann.id)
    assert now is not None and now.email == "ann@acme.org" and not now.active


async def test_many_members_added_at_once_are_all_kept(people: Directory) -> None:
    users = [await people.create_user(f"u{i}") for i in range(10)]
    await asyncio.gather(*(people.set_member("", u.id, ACME, "member") for u in users))
    assert len(await people.members("acme")) == 10


async def test_one_name_taken_twice_at_once_is_made_once(people: Directory) -> None:
    made = await asyncio.gather(
        *(people.create_user("ann") for _ in range(5)), return_exceptions=True
    )
    assert sum(not isinstance(m, Exception) for m in made) == 1
    assert len(await people.users()) == 1


async def test_a_hand_and_a_group_at_once_leave_the_hand_s_role(people: Directory) -> None:
    ann = await people.create_user("ann")
    await asyncio.gather(
        people.set_member("", ann.id, ACME, "member", set_by="group", group="all"),
        people.set_member("", ann.id, ACME, "manager"),
        people.set_member("", ann.id, ACME, "member", set_by="group", group="all"),
    )
    assert await people.role_in(ann.id, "acme") == "manager"


async def test_a_project_made_while_its_team_is_deleted_is_never_orphaned(
    people: Directory,
) -> None:
    await people.create_team("acme", "ml")
    outcome = await asyncio.gather(
        people.create_project("acme", "chat", team="ml"),
        people.delete_team("acme", "ml"),
        return_exceptions=True,
    )
    teams = {t.name for t in await people.teams("acme")}
    projects = await people.projects("acme")
    assert all(p.team in teams for p in projects if p.team), outcome
    assert any(isinstance(o, PeopleError) for o in outcome)


class HeldRange:
    """A store whose reads of a range wait, once read, until let go: a change can be made
    between a read and the write that follows it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.read = asyncio.Event()
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def range(self, key: str, end: str | None = None, **kw: int) -> object:
        got = await self.store.range(key, end, **kw)
        self.read.set()
        await self.go.wait()
        return got


async def test_a_team_deleted_while_a_project_is_made_in_it_is_kept(store: Store) -> None:
    people = Directory(store)
    await people.create_org("acme")
    await people.create_team("acme", "ml")
    held = HeldRange(store)
    deleting = asyncio.create_task(Directory(held).delete_team("acme", "ml"))  # type: ignore[arg-type]
    await held.read.wait()  # it has seen no project in the team
    await people.create_project("acme", "chat", team="ml")
    held.go.set()
    with pytest.raises(PeopleError) as e:
        await deleting
    assert e.value.kind == "conflict"
    assert [t.name for t in await people.teams("acme")] == ["ml"]
