"""Backup and restore of one control plane on SQLite, end to end: `llmgw backup` over the API
(socket and HTTPS) into a sealed file, the old host wiped, `llmgwd restore` on a fresh one:
the same CA and secret, every key still verifies, usage the same; a wrong passphrase, a host
not fresh and a store of a newer schema refused with nothing written."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec
import pytest
from click.testing import CliRunner

from llmgw import backup_archive, config, ipc, pki, sealed
from llmgw.api_types import BackupBundle
from llmgw.cli import backup as cli_backup
from llmgw.cli.main import main
from llmgw.config import ClientPort, ClusterPort, ServerConfig
from llmgwd.accounting.usage import Usage
from llmgwd.api.access import key_auth, peercred_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.daemon import Daemon
from llmgwd.planes import backup, host_commands
from llmgwd.planes.listing import ControlPlanes
from llmgwd.planes.tokens import PlaneTokens
from llmgwd.store import Store, schema
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.https_site import ADMIN_SECRET, WithAdmin, add_context, make_tls, start_tls_site
from tests.llmgw.test_cli import _start_site

T = TypeVar("T")
PHRASE = "correct horse battery staple"
DAY = "2026-12-05"


@dataclass
class Old:
    """The control plane backed up: its state dir, CA, secret, a key and its usage."""

    state_dir: Path
    ca: pki.CertKey
    secret: bytes
    key: str  # the API key's secret, as its user holds it
    usage: list[Any]


async def fill(state_dir: Path) -> tuple[SqliteStore, Catalog, str, list[Any]]:
    store = await SqliteStore.open(state_dir / "state.db")
    catalog, key, usage = await fill_store(store)
    return store, catalog, key, usage


async def fill_store(store: Store) -> tuple[Catalog, str, list[Any]]:
    """A key and a day's usage in store: the key's secret and the usage as read back."""
    await schema.check(store)
    catalog = Catalog(store)
    await catalog.load()
    _, key = await catalog.create_key("alice")
    usage = Usage(store)
    usage.add((DAY, "k1", "smol"), 10, 5, 7)
    await usage.flush()
    return catalog, key, await usage.records(DAY)


def source(old: Old, store: Store) -> backup.Source:
    cfg = ServerConfig(name="site", state_dir=str(old.state_dir))
    return backup.Source(store, cfg, old.ca, old.secret, "cp1")


async def restored_state(state_dir: Path, key: str) -> tuple[bool, list[Any]]:
    """Whether the key verifies on the restored store, and its usage."""
    store = await SqliteStore.open(state_dir / "state.db")
    try:
        catalog = Catalog(store)
        await catalog.load()
        return catalog.authenticate(key) is not None, await Usage(store).records(DAY)
    finally:
        await store.close()


@pytest.fixture
def old(tmp_path: Path) -> Old:
    d = tmp_path / "old"
    d.mkdir()
    return Old(d, pki.make_ca("site"), os.urandom(32), "", [])


async def sealed_backup(src: backup.Source, path: Path) -> BackupBundle:
    """src backed up into a file at path as `llmgw backup` writes it (POST /backup's stream,
    sealed as it comes, a piece at a time); its bundle (its store empty)."""
    async with backup.dump(src) as made:
        with path.open("wb") as out:
            sealer = sealed.Sealer(out, PHRASE)
            sealer.write(backup_archive.head(made.bundle, made.store_bytes))
            while piece := made.store.read(backup_archive.PIECE):
                sealer.write(piece)
            sealer.close()
    return made.bundle


def read_back(file: Path, phrase: str = PHRASE) -> BackupBundle:
    """A backup file opened and read to its verified end, as `llmgwd restore` reads it; its
    bundle (its store empty)."""
    with file.open("rb") as f:
        opened = cli_backup.open_backup(f, phrase)
        opened.copy_store(backup_archive.Discard())
    return opened.bundle


def make_file(old: Old, tmp_path: Path, *, wrap: bool = False) -> Path:
    """Fill the old control plane, back it up (through a store that is not SQLite's when
    wrap: etcd's way) into a sealed file, and wipe the old state dir."""
    path = tmp_path / "cluster.backup"

    async def made() -> None:
        store, _, old.key, old.usage = await fill(old.state_dir)
        try:
            used: Store = cast(Store, NotSqlite(store)) if wrap else store
            await sealed_backup(source(old, used), path)
        finally:
            await store.close()

    asyncio.run(made())
    shutil.rmtree(old.state_dir)
    return path


class NotSqlite:
    """A store of another kind (as etcd's is): every call passed to the SQLite one."""

    def __init__(self, inner: SqliteStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def restore(
    file: Path,
    fresh: Path,
    phrase: str = PHRASE,
    *,
    config_path: Path | None = None,
    owner: tuple[int, int] | None = None,
) -> ServerConfig:
    """The file restored into fresh as `llmgwd restore` does it: its store staged as the file
    is read, the rest written once it was whole (server.yaml in fresh unless config_path)."""
    with file.open("rb") as f:
        opened = cli_backup.open_backup(f, phrase)
        settings = config_path or fresh / "server.yaml"
        return backup.restore(opened.bundle, fresh, settings, owner, opened.copy_store)


@pytest.mark.parametrize("wrap", [False, True], ids=["sqlite-backup", "keys-copied"])
def test_a_restored_cluster_has_its_ca_secret_keys_and_usage(
    old: Old, tmp_path: Path, wrap: bool
) -> None:
    file = make_file(old, tmp_path, wrap=wrap)
    assert not old.state_dir.exists()
    assert PHRASE.encode() not in file.read_bytes() and old.secret not in file.read_bytes()
    fresh = tmp_path / "fresh"
    cfg = restore(file, fresh)
    assert (cfg.name, cfg.store.backend, cfg.state_dir) == ("site", "sqlite", str(fresh))
    assert config.load(fresh / "server.yaml", ServerConfig).name == "site"
    assert pki.read_pair(fresh / "pki/ca.pem", fresh / "pki/ca.key") == old.ca
    assert (fresh / "secret").read_bytes() == old.secret
    assert (fresh / "secret").stat().st_mode & 0o777 == 0o600
    assert (fresh / "state.db").stat().st_mode & 0o777 == 0o600
    verifies, usage = asyncio.run(restored_state(fresh, old.key))
    assert verifies
    assert usage == old.usage and usage[0].counts.requests == 1


def test_a_wrong_passphrase_is_refused_and_nothing_is_written(old: Old, tmp_path: Path) -> None:
    file = make_file(old, tmp_path)
    fresh = tmp_path / "fresh"
    with pytest.raises(sealed.SealError, match="wrong passphrase"):
        restore(file, fresh, "not the passphrase at all")
    assert not fresh.exists()
    changed = bytearray(file.read_bytes())
    changed[-1] ^= 1
    file.write_bytes(bytes(changed))
    with pytest.raises(sealed.SealError, match="changed since it was made"):
        restore(file, fresh)
    assert not fresh.exists()


def test_a_host_with_a_control_planes_state_is_not_restored_over(old: Old, tmp_path: Path) -> None:
    file = make_file(old, tmp_path)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "state.db").write_bytes(b"its own")
    with pytest.raises(backup.RestoreRefused, match="restore on a fresh host"):
        restore(file, fresh)
    assert sorted(p.name for p in fresh.iterdir()) == ["state.db"]
    assert (fresh / "state.db").read_bytes() == b"its own"


def test_the_restored_settings_are_0640_of_llmgws_group_in_a_0750_directory(
    old: Old, tmp_path: Path
) -> None:
    """server.yaml may hold a proxy's password: restored as the package has it, not 0644."""
    file = make_file(old, tmp_path)
    etc = tmp_path / "etc" / "llmgw"  # missing: restore makes it
    others = [g for g in os.getgroups() if g != os.getgid()]
    gid = 1 if os.geteuid() == 0 else next(iter(others), os.getgid())  # llmgw's, here
    restore(file, tmp_path / "fresh", config_path=etc / "server.yaml", owner=(os.getuid(), gid))
    settings = (etc / "server.yaml").stat()
    assert (settings.st_mode & 0o777, settings.st_gid) == (0o640, gid)
    assert (etc.stat().st_mode & 0o777, etc.stat().st_gid) == (0o750, gid)


def test_a_restore_failing_on_the_settings_leaves_nothing_behind_and_is_tried_again(
    old: Old, tmp_path: Path
) -> None:
    file = make_file(old, tmp_path)
    fresh, blocked = tmp_path / "fresh", tmp_path / "etc"
    blocked.write_text("a file where server.yaml's directory should be")
    with pytest.raises(OSError):
        restore(file, fresh, config_path=blocked / "llmgw" / "server.yaml")
    assert [p for p in fresh.rglob("*") if not p.is_dir()] == []  # no CA, secret, store
    restore(file, fresh)  # the same file again, the settings where they can be written
    assert pki.read_pair(fresh / "pki/ca.pem", fresh / "pki/ca.key") == old.ca
    assert (fresh / "secret").read_bytes() == old.secret


def test_a_backup_of_a_newer_schema_is_refused_by_an_older_llmgwd(
    old: Old, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = make_file(old, tmp_path)
    monkeypatch.setattr(schema, "SCHEMA", 0)  # this llmgwd is older than the backup's
    monkeypatch.setattr(schema, "OLDEST_SCHEMA", 0)
    fresh = tmp_path / "fresh"
    with pytest.raises(backup.RestoreRefused, match=r"the store's schema is 1 .*nothing was"):
        restore(file, fresh)
    assert sorted(p.name for p in fresh.iterdir()) == []


# Through the CLI: `llmgw backup` over the API, `llmgwd restore` (what `llmgw restore` runs)


@pytest.fixture(params=["socket", "https"])
def served(old: Old, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The old control plane's API with its backup route; the CLI's arguments and env."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(10)

    store, catalog, old.key, old.usage = run(fill(old.state_dir))
    planes = ControlPlanes(store, None, PlaneTokens(store, old.ca.cert_pem), "cp1",
                           "https://cp1:7710", backup=source(old, store))  # fmt: skip
    ctx = ApiContext(catalog=catalog, nodes=cast(Any, None), mint_token=lambda: "t",
                     join_url="https://cp1:7710", control_planes=planes)  # fmt: skip
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    sock = str(tmp_path / "d.sock")
    if request.param == "socket":
        runner = run(_start_site(api_app(ctx, peercred_auth("llmgw")), sock))
    else:
        tls = make_tls(tmp_path)
        runner, url = run(start_tls_site(api_app(ctx, key_auth(WithAdmin(catalog))), tls.server))
        (tmp_path / "admin.key").write_text(ADMIN_SECRET + "\n")
        add_context(tmp_path / "config", "test", url, "--ca-fingerprint", tls.fingerprint,
                    "--key-file", str(tmp_path / "admin.key"))  # fmt: skip
        env["LLMGW_CONTEXT"] = "test"
    yield {"socket": sock, **env}
    run(runner.cleanup())
    run(store.close())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_llmgw_backup_then_llmgwd_restore_on_a_fresh_host(
    old: Old, served: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    phrase_file = tmp_path / "phrase"
    phrase_file.write_text(PHRASE + "\n")
    file = tmp_path / "cluster.backup"
    env = {k: v for k, v in served.items() if k != "socket"}
    args = ["--socket", served["socket"], "backup", str(file), "--passphrase-file"]
    r = CliRunner().invoke(main, [*args, str(phrase_file)], env=env)
    assert r.exit_code == 0, r.output
    assert "Backed up cluster site, made " in r.stdout and "control plane cp1" in r.stdout
    assert file.stat().st_mode & 0o777 == 0o600
    again = CliRunner().invoke(main, [*args, str(phrase_file)], env=env)
    assert again.exit_code == 1 and "exists: use --force" in again.output

    fresh = tmp_path / "fresh"  # the backup's settings name the old state dir: moved here
    me = pwd.getpwuid(os.getuid())
    monkeypatch.setattr(pwd, "getpwnam", lambda _: me)
    monkeypatch.setattr(backup, "restored_config", _into(fresh))
    restore = ["restore", str(file), "--passphrase-file", str(phrase_file), "--config",
               str(fresh / "server.yaml"), "--no-start"]  # fmt: skip
    wrong = tmp_path / "wrong"
    wrong.write_text("not the passphrase at all\n")
    r = CliRunner().invoke(host_commands.host, [*restore[:3], str(wrong), *restore[4:]])
    assert r.exit_code == 1 and "wrong passphrase" in r.output and not fresh.exists()
    # `llmgw restore` runs `llmgwd restore` with its arguments (here in this process)
    ran: list[list[str]] = []

    def run_llmgwd(args: list[str], env: dict[str, str] | None = None) -> None:
        ran.append(args)
        host_commands.host.main(args, prog_name="llmgwd", standalone_mode=False)

    monkeypatch.setattr(cli_backup, "run_llmgwd", run_llmgwd)
    r = CliRunner().invoke(main, ["--socket", served["socket"], *restore], env=env)
    assert r.exit_code == 0, r.output
    assert ran == [[*restore[:-1], "--socket", served["socket"], "--no-start"]]
    assert "Cluster site restored on this host" in r.stdout
    assert (fresh / "secret").read_bytes() == old.secret
    assert asyncio.run(restored_state(fresh, old.key)) == (True, old.usage)


def test_llmgw_backup_follows_no_link_planted_where_it_writes(
    served: dict[str, str], tmp_path: Path
) -> None:
    """`sudo llmgw backup /tmp/x`: a link another user put at a temporary name beside FILE
    (the one it used to take) is neither followed nor taken as the backup."""
    victim = tmp_path / "victim"
    victim.write_text("root's own file\n")
    out = tmp_path / "shared"
    out.mkdir()
    (out / ".cluster.backup.tmp").symlink_to(victim)
    phrase_file = tmp_path / "phrase"
    phrase_file.write_text(PHRASE + "\n")
    env = {k: v for k, v in served.items() if k != "socket"}
    args = ["--socket", served["socket"], "backup", str(out / "cluster.backup")]
    r = CliRunner().invoke(main, [*args, "--passphrase-file", str(phrase_file)], env=env)
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "root's own file\n"
    assert sorted(p.name for p in out.iterdir()) == [".cluster.backup.tmp", "cluster.backup"]
    written = out / "cluster.backup"
    assert not written.is_symlink() and written.stat().st_mode & 0o777 == 0o600
    assert read_back(written).cluster == "site"


def _into(fresh: Path) -> Any:
    real = backup.restored_config

    def restored_config(bundle: BackupBundle, state_dir: Path | None) -> ServerConfig:
        return real(bundle, fresh)

    return restored_config


# llmgwd itself: its socket answers POST /api/v1/backup with its own CA, secret and store


async def test_a_running_llmgwd_backs_itself_up(tmp_path: Path) -> None:
    cfg = ServerConfig(
        name="site", state_dir=str(tmp_path / "state"), socket=str(tmp_path / "llmgwd.sock"),
        client=ClientPort(listen="127.0.0.1:0"),
        cluster=ClusterPort(listen="127.0.0.1:0", advertise="https://127.0.0.1:17710"),
    )  # fmt: skip
    d = Daemon(cfg)
    await d.start()
    try:
        _, key = await d.catalog.create_key("alice")
        status, answer = await asyncio.to_thread(ipc.request, cfg.socket, "POST", "/api/v1/backup")
    finally:
        await d.stop()
    assert status == 200
    bundle = msgspec.convert(answer, BackupBundle)
    state = Path(cfg.state_dir)
    assert (bundle.cluster, bundle.backend, bundle.plane) == ("site", "sqlite", "127.0.0.1")
    assert bundle.ca_cert_pem.encode() == (state / "pki/ca.pem").read_bytes()
    assert bundle.secret == (state / "secret").read_bytes()
    fresh = tmp_path / "fresh"
    await asyncio.to_thread(backup.restore, bundle, fresh, fresh / "server.yaml", None)
    assert (await restored_state(fresh, key))[0]
