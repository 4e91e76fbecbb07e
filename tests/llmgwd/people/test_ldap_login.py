"""`llmgw login` with an LDAP directory beside the OIDC provider: the sign-in reads the
directory's groups (Debian's slapd, by StartTLS) as well as the token's, each source's
membership kept by the same rules, the strongest holding."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llmgw.config import Oidc
from llmgwd.catalog import Catalog
from llmgwd.people.ldap import LdapGroups
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.people import slapd
from tests.llmgwd.people.test_ldap import settings
from tests.llmgwd.people.test_oidc_login import (  # noqa: F401 (issuer: the fixture)
    RULES,
    Gateway,
    NoNodes,
    _llmgw_login,
    _put_user,
    issuer,
    serving_login,
)

pytestmark = pytest.mark.skipif(not slapd.SLAPD, reason="slapd is not installed (Debian's slapd)")


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[slapd.Slapd]:
    server = slapd.start(tmp_path)
    yield server
    server.stop()


@pytest.fixture
async def gw(
    issuer: str,  # noqa: F811
    directory: slapd.Slapd,
    tmp_path: Path,
) -> AsyncIterator[Gateway]:
    """The sign-in routes as llmgwd mounts them, with the directory read at each sign-in."""
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    secret_file = tmp_path / "client-secret"
    secret_file.write_text("llmgw-client-secret\n")  # the provider takes any
    oidc = Oidc(issuer=issuer, client_id="llmgw", client_secret_file=str(secret_file),
                scopes=("openid", "email", "profile"), rules=RULES)  # fmt: skip
    groups = LdapGroups(store, settings(directory, tmp_path), oidc)
    async with serving_login(catalog, oidc, groups.signed_in) as gw:
        yield gw
    await store.close()


async def test_llmgw_login_reads_the_directorys_groups_beside_the_tokens(
    issuer: str,  # noqa: F811
    gw: Gateway,
    directory: slapd.Slapd,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    directory.add_person("ada")
    directory.set_group("physics-staff", "ada")  # the directory makes her a manager
    _put_user(
        issuer,
        "ada-sub",
        {"preferred_username": "ada", "email": "ada@acme.example", "groups": ["physics-all"]},
    )
    result = await _llmgw_login(gw, "ada-sub", tmp_path / "a", monkeypatch)
    assert result.exit_code == 0, result.output
    ada = await gw.people.user("ada")
    assert ada is not None
    (m,) = await gw.people.members("physics")
    assert (m.role, dict(m.sources)) == ("manager", {"oidc": "member", "ldap": "manager"})
    directory.set_group("physics-staff")  # she left the staff group: at her next sign-in
    result = await _llmgw_login(gw, "ada-sub", tmp_path / "b", monkeypatch)
    assert result.exit_code == 0, result.output
    (m,) = await gw.people.members("physics")
    assert (m.role, dict(m.sources)) == ("member", {"oidc": "member"})
