"""POST /api/v1/backup hands out the CA key and secret: only over TLS, the socket or loopback,
one at a time, and the log names who asked."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from llmgw.api_types import BackupBundle
from llmgw.errors import ApiError
from llmgwd import auth
from llmgwd.api import backup as backup_route
from llmgwd.api.access import private_path
from llmgwd.api.base import CTX
from llmgwd.auth import Principal
from llmgwd.planes import backup

BUNDLE = BackupBundle(made_at=0.0, cluster="site", plane="cp1", version="0", schema=1,
                      backend="sqlite", keys=1, store=b"", ca_cert_pem="", ca_key_pem="",
                      secret=b"s", settings="")  # fmt: skip


def _request(peer: tuple[str, int] | str, family: int, tls: bool, ctx: Any = None) -> web.Request:
    sock = mock.Mock(family=family)
    tls_context = ssl.create_default_context() if tls else None
    extra = {"peername": peer, "socket": sock, "sslcontext": tls_context}
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: extra.get(name, default)
    app = web.Application()
    if ctx is not None:
        app[CTX] = ctx
    req = make_mocked_request(
        "POST", "/api/v1/backup", app=app, transport=transport, sslcontext=tls_context
    )
    req[auth.PRINCIPAL] = Principal("key k1 (ops)", staff="admin")
    return req


@pytest.mark.parametrize(
    ("peer", "family", "tls", "private"),
    [
        (("10.1.2.3", 5000), socket.AF_INET, True, True),  # https from anywhere
        ("", socket.AF_UNIX, False, True),  # the control plane's socket
        (("127.0.0.1", 5000), socket.AF_INET, False, True),  # this host
        (("::1", 5000, 0, 0), socket.AF_INET6, False, True),
        (("10.1.2.3", 5000), socket.AF_INET, False, False),  # plain http over the network
        (("2001:db8::5", 5000, 0, 0), socket.AF_INET6, False, False),
    ],
)
def test_which_paths_keep_a_secret_off_the_network(
    peer: Any, family: int, tls: bool, private: bool
) -> None:
    assert private_path(_request(peer, family, tls)) is private


class _Planes:
    def __init__(self) -> None:
        self.backup = object()
        self.release = asyncio.Event()


def _ctx() -> Any:
    async def flush() -> None:
        return None

    return SimpleNamespace(control_planes=_Planes(), usage=SimpleNamespace(flush=flush))


async def test_plain_http_from_the_network_is_refused_before_anything_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = mock.MagicMock()
    monkeypatch.setattr(backup, "dump", made)
    req = _request(("10.1.2.3", 5000), socket.AF_INET, False, _ctx())
    with pytest.raises(ApiError) as e:
        await backup_route.make_backup(req)
    assert (e.value.status, e.value.detail.code) == (403, "tls_required")
    made.assert_not_called()


async def test_a_second_backup_meanwhile_is_told_to_wait_and_the_log_names_the_caller(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = _ctx()
    gate = asyncio.Event()

    @contextlib.asynccontextmanager
    async def slow(_src: object) -> AsyncIterator[backup.Dump]:
        await gate.wait()
        yield backup.Dump(BUNDLE, io.BytesIO(b"state"), 5)

    monkeypatch.setattr(backup, "dump", slow)
    caplog.set_level(logging.INFO, "llmgwd.api.backup")
    first = asyncio.create_task(
        backup_route.make_backup(_request(("10.1.2.3", 1), socket.AF_INET, True, ctx))
    )
    await asyncio.sleep(0.01)
    with pytest.raises(ApiError) as e:
        await backup_route.make_backup(_request(("10.1.2.4", 2), socket.AF_INET, True, ctx))
    assert (e.value.status, e.value.detail.code) == (409, "backup_running")
    gate.set()
    answer = await first
    assert answer.status == 200 and answer.headers["Cache-Control"] == "no-store"
    assert "backup asked by key k1 (ops) from 10.1.2.3" in caplog.text
