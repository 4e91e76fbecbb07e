"""`llmgw mirror add-peer` on a mirror alone (mode: mirror): the peer is added as on any
mirror, and the answer and the CLI say what a control plane's operator runs to copy from
this machine (add-peer there with its /hf, or mirror.upstream), with its key and its CA."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from llmgw.cli.main import main
from llmgw.config import ServerConfig, parse
from llmgwd import mirror_only
from llmgwd.api.base import ApiContext
from llmgwd.catalog import Catalog
from llmgwd.mirror.records import Records
from llmgwd.mirror.service import Mirror, Settings
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.mirror.test_mirror import NoNodes, anyone

CONFIG = "name: m\nmode: mirror\nstate_dir: /var/lib/llmgw\nclient:\n  listen: 10.0.0.5:7700\n"


@pytest.fixture
async def socket_of(tmp_path: Path) -> AsyncIterator[tuple[str, Mirror]]:
    """/api/v1 of a mirror alone on a local socket, as mirror_only serves it."""
    store = await SqliteStore.open(":memory:")
    catalog = Catalog(store)
    await catalog.load()
    mirror = Mirror(Settings(dir=tmp_path / "m", upstream="http://127.0.0.1:9/hf"), Records(store))
    await mirror.start()
    config = parse(CONFIG, ServerConfig)
    ctx = ApiContext(
        catalog=catalog, nodes=NoNodes(), mint_token=mirror_only.no_join_token, join_url="",
        mode=mirror_only.MODE, as_peer=mirror_only.as_peer(config), mirror=mirror,
    )  # fmt: skip
    app = web.Application()
    app.add_subapp("/api/v1", mirror_only.api(ctx, anyone))
    runner = web.AppRunner(app)
    await runner.setup()
    path = str(tmp_path / "llmgwd.sock")
    await web.UnixSite(runner, path).start()
    yield path, mirror
    await runner.cleanup()
    await mirror.close()
    await store.close()


def _cli(path: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--socket", path, *args])


async def test_add_peer_on_a_mirror_alone_says_what_a_control_plane_runs(
    socket_of: tuple[str, Mirror],
) -> None:
    path, mirror = socket_of
    peer = "https://m2.example:7700/hf"
    r = await asyncio.to_thread(_cli, path, "mirror", "add-peer", peer, "--token-file", "/k")
    assert r.exit_code == 0, r.output
    assert [p.url for p in mirror.records.peers()] == [peer]  # still added here
    assert f"Added peer {peer}" in r.output
    assert "llmgw mirror add-peer https://10.0.0.5:7700/hf --token-file FILE" in r.output
    assert "mirror.upstream: https://10.0.0.5:7700/hf" in r.output
    assert "mirror.ca_file: a copy of /var/lib/llmgw/pki/ca.pem" in r.output
    r = await asyncio.to_thread(_cli, path, "mirror", "add-peer", peer, "--json")
    assert '"as_peer": "This llmgwd is a mirror alone.' in r.output, r.output


def test_a_wildcard_listen_is_named_by_the_fqdn_and_v6_in_brackets() -> None:
    config = parse(CONFIG.replace("10.0.0.5", "0.0.0.0"), ServerConfig)
    assert mirror_only.hf_url(config) == f"https://{socket.getfqdn()}:7700/hf"
    config = parse(CONFIG.replace("10.0.0.5:7700", '"[fd00::5]:7700"'), ServerConfig)
    assert mirror_only.hf_url(config) == "https://[fd00::5]:7700/hf"
