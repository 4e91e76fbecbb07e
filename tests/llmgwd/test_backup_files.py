"""A backup keeps the files the settings name (the OIDC client secret, the client port's
certificate and key) and a restore writes them back with their modes and owners; and the
usage counted in the seconds before POST /backup is in it."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from llmgw import ipc, pki
from llmgw.api_types import BackupBundle, SiteFile
from llmgw.config import ClientPort, Oidc, ServerConfig
from llmgwd.accounting.usage import Usage
from llmgwd.api.access import peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.planes import backup, site_files
from llmgwd.planes.listing import ControlPlanes
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store import schema
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.test_cli import _start_site

MODES = {"oidc-client-secret": 0o600, "client.pem": 0o644, "client.key": 0o640}


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ServerConfig]:
    """Settings naming an OIDC client secret and the client port's certificate and key, the
    files there with their modes."""
    etc = tmp_path / "etc"
    etc.mkdir()
    for name, mode in MODES.items():
        (etc / name).write_bytes(f"the {name} bytes\n".encode())
        (etc / name).chmod(mode)
    yield ServerConfig(
        name="site", state_dir=str(tmp_path / "old"),
        oidc=Oidc(issuer="https://idp.example", client_id="llmgw",
                  client_secret_file=str(etc / "oidc-client-secret")),
        client=ClientPort(tls_cert=str(etc / "client.pem"), tls_key=str(etc / "client.key")),
    )  # fmt: skip


def made(cfg: ServerConfig) -> BackupBundle:
    async def run() -> BackupBundle:
        store = await SqliteStore.open(":memory:")
        try:
            await schema.check(store)
            src = backup.Source(store, cfg, pki.make_ca("site"), os.urandom(32), "cp1")
            async with backup.dump(src) as made:  # a store of a few KiB: held, as bytes
                data = made.store.read()
            return msgspec.structs.replace(made.bundle, store=data)
        finally:
            await store.close()

    return asyncio.run(run())


def me() -> tuple[str, str]:
    return pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name


def test_named_files_come_back_with_their_bytes_modes_and_owners(
    site: ServerConfig, tmp_path: Path
) -> None:
    bundle = made(site)
    etc = tmp_path / "etc"
    assert sorted(Path(f.path).name for f in bundle.files) == sorted(MODES)
    assert {(f.owner, f.group) for f in bundle.files} == {me()}
    shutil.rmtree(etc)  # the host is lost
    fresh = tmp_path / "fresh"
    backup.restore(bundle, fresh, fresh / "server.yaml", None)
    for name, mode in MODES.items():
        st = (etc / name).stat()
        assert (etc / name).read_bytes() == f"the {name} bytes\n".encode()
        assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (mode, os.getuid(), os.getgid())
    assert sorted(p.name for p in etc.iterdir()) == sorted(MODES)  # no temporary left


def test_a_restore_follows_no_link_planted_beside_a_named_file(
    site: ServerConfig, tmp_path: Path
) -> None:
    """A link another user put at a temporary name beside client.key (the one restore used
    to take) is neither followed nor taken as the restored file."""
    bundle = made(site)
    etc = tmp_path / "etc"
    shutil.rmtree(etc)
    etc.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("root's own file\n")
    (etc / ".client.key.restoring").symlink_to(victim)
    fresh = tmp_path / "fresh"
    backup.restore(bundle, fresh, fresh / "server.yaml", None)
    assert victim.read_text() == "root's own file\n"
    key = etc / "client.key"
    assert not key.is_symlink() and key.read_bytes() == b"the client.key bytes\n"
    assert key.stat().st_mode & 0o7777 == 0o640


def test_a_backup_reads_the_named_files_off_the_event_loop(
    site: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their reads and their owners' names (NSS: maybe LDAP over the network) may block."""
    real, loops = site_files.read, []

    def read(cfg: ServerConfig) -> tuple[SiteFile, ...]:
        with contextlib.suppress(RuntimeError):  # no loop runs in this thread
            loops.append(asyncio.get_running_loop())
        return real(cfg)

    monkeypatch.setattr(site_files, "read", read)
    assert len(made(site).files) == len(MODES)
    assert loops == []


def test_a_named_file_there_already_and_different_is_not_written_over(
    site: ServerConfig, tmp_path: Path
) -> None:
    bundle = made(site)
    (tmp_path / "etc/client.key").write_bytes(b"this host's own key\n")
    fresh = tmp_path / "fresh"
    with pytest.raises(backup.RestoreRefused, match=r"client\.key exists and differs"):
        backup.restore(bundle, fresh, fresh / "server.yaml", None)
    assert (tmp_path / "etc/client.key").read_bytes() == b"this host's own key\n"
    assert not fresh.exists()


def test_an_owner_this_host_lacks_is_refused_before_anything_is_written(
    site: ServerConfig, tmp_path: Path
) -> None:
    bundle = made(site)
    shutil.rmtree(tmp_path / "etc")
    f = bundle.files[0]
    moved = msgspec.structs.replace(f, owner="no-such-user-llmgw")
    bundle = msgspec.structs.replace(bundle, files=(moved, *bundle.files[1:]))
    fresh = tmp_path / "fresh"
    with pytest.raises(backup.RestoreRefused, match="there is no user no-such-user-llmgw"):
        backup.restore(bundle, fresh, fresh / "server.yaml", None)
    assert not (tmp_path / "etc").exists() and not fresh.exists()


def test_a_named_file_that_cannot_be_read_fails_the_backup_saying_which(
    site: ServerConfig, tmp_path: Path
) -> None:
    (tmp_path / "etc/client.key").unlink()
    with pytest.raises(backup.BackupFailed, match=r"client\.key \(named in the settings\)"):
        made(site)


def test_settings_naming_no_file_keep_none() -> None:
    assert made(ServerConfig(name="site")).files == ()


def test_post_backup_holds_the_usage_not_yet_flushed(tmp_path: Path) -> None:
    async def run() -> tuple[BackupBundle, list[Any]]:
        store = await SqliteStore.open(tmp_path / "state.db")
        await schema.check(store)
        catalog, usage = Catalog(store), Usage(store)
        await catalog.load()
        usage.add(("2026-12-06", "k1", "smol"), 10, 5, 7)  # counted, not flushed
        src = backup.Source(store, ServerConfig(name="site"), pki.make_ca("s"), b"s" * 32, "cp1")
        planes = ControlPlanes(store, None, PlaneTokens(store, src.ca.cert_pem), "cp1",
                               "https://cp1:7710", backup=src)  # fmt: skip
        ctx = ApiContext(catalog=catalog, nodes=cast(Any, None), mint_token=lambda: "t",
                         join_url="https://cp1:7710", control_planes=planes,
                         usage=usage)  # fmt: skip
        sock = str(tmp_path / "d.sock")
        group = grp.getgrgid(os.getgid()).gr_name
        runner = await _start_site(api_app(ctx, peercred_auth(group)), sock)
        try:
            status, body = await asyncio.to_thread(ipc.request, sock, "POST", "/api/v1/backup")
        finally:
            await runner.cleanup()
            await store.close()
        assert status == 200, body
        bundle = msgspec.json.decode(msgspec.json.encode(body), type=BackupBundle)
        copy = tmp_path / "copy.db"
        copy.write_bytes(bundle.store)
        restored = await SqliteStore.open(copy)
        try:
            return bundle, await Usage(restored).records("2026-12-06")
        finally:
            await restored.close()

    _, records = asyncio.run(run())
    assert [(r.key_id, r.counts.requests, r.counts.prompt_tokens) for r in records] == [
        ("k1", 1, 10)
    ]
