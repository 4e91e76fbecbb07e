"""Outbound proxies (llmgw.proxy): which proxy a URL goes through, NO_PROXY's matching, the
setting over the environment, credentials never shown, and llmgw.download through a real
forward proxy on the loopback: with its credentials, straight for NO_PROXY's hosts, and the
proxy's refusal or absence said as the proxy's."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgw import config, download, proxy
from llmgw.blobstore import BlobStore
from llmgw.download import DownloadError
from llmgw.proxy import DIRECT, Route
from llmgw.wire import ModelFile
from llmgw_agentd import main as agentd_main
from llmgwd import main as llmgwd_main
from tests.llmgw.forward_proxy import ForwardProxy

SECRET = "pr0xy-s3cret"
DATA = bytes(range(256)) * 64
WANT = ModelFile(path="model.gguf", size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest())


@pytest.mark.parametrize(
    ("entry", "url", "straight"),
    [
        ("*", "https://huggingface.co/x", True),
        ("huggingface.co", "https://huggingface.co/x", True),
        ("huggingface.co", "https://cdn-lfs.huggingface.co/x", True),
        (".huggingface.co", "https://cdn-lfs.huggingface.co/x", True),
        ("huggingface.co", "https://nothuggingface.co/x", False),
        ("HuggingFace.CO", "https://huggingface.co./x", True),
        ("10.0.0.0/8", "http://10.1.2.3:7700/hf", True),
        ("10.0.0.0/8", "http://11.1.2.3:7700/hf", False),
        ("10.1.2.3", "http://10.1.2.3/hf", True),
        ("::1", "http://[::1]:7700/hf", True),
        ("fd00::/8", "http://[fd00::5]/", True),
        ("mirror.site:7700", "http://mirror.site:7700/hf", True),
        ("mirror.site:7700", "http://mirror.site:8800/hf", False),
        ("", "https://huggingface.co/x", False),
    ],
)
def test_no_proxy_entries_match_as_curl_reads_them(entry: str, url: str, straight: bool) -> None:
    route = Route(https="http://p:3128", http="http://p:3128", no_proxy=(entry,))
    assert route.proxy_for(url) == ("" if straight else "http://p:3128")


def test_https_and_http_targets_take_their_own_proxy() -> None:
    route = Route(https="http://secure:3128", http="http://plain:3128")
    assert route.proxy_for("https://huggingface.co/api") == "http://secure:3128"
    assert route.proxy_for("http://hub.site/api") == "http://plain:3128"
    assert DIRECT.proxy_for("https://huggingface.co/api") == ""
    assert DIRECT.request_kw("https://huggingface.co/api") == {}


def test_the_environment_is_read_only_where_the_setting_is_absent() -> None:
    env = {"HTTPS_PROXY": "http://envproxy:3128", "http_proxy": "http://plain:80",
           "NO_PROXY": "localhost, .site"}  # fmt: skip
    from_env = config.Network().route(env)
    assert from_env == Route("http://envproxy:3128", "http://plain:80", ("localhost", ".site"))
    setting = config.Network(proxy="http://setting:8080").route(env)
    assert setting == Route("http://setting:8080", "http://setting:8080", ("localhost", ".site"))
    narrowed = config.Network(proxy="http://setting:8080", no_proxy=("hub.site",)).route(env)
    assert narrowed.no_proxy == ("hub.site",)
    assert config.Network(proxy="none").route(env) == DIRECT
    assert config.Network().route({}) == DIRECT


def test_a_proxy_with_credentials_is_never_shown() -> None:
    with pytest.raises(config.ConfigError) as bad:
        config.parse(f"network:\n  proxy: ftp://user:{SECRET}@p:21\n", config.ServerConfig)
    assert "network.proxy" in str(bad.value) and ":2:" in str(bad.value)
    assert SECRET not in str(bad.value)
    with pytest.raises(config.ConfigError) as env_bad:
        config.Network().route({"HTTPS_PROXY": f"socks5://user:{SECRET}@p:1080"})
    assert "HTTPS_PROXY" in str(env_bad.value) and SECRET not in str(env_bad.value)
    cfg = config.parse(f"network:\n  proxy: http://user:{SECRET}@p:3128\n", config.AgentConfig)
    route = cfg.network.route({})
    assert route.shown() == "proxy http://****@p:3128"


def test_children_get_the_route_in_both_cases_and_nothing_without_one() -> None:
    route = Route("http://p:3128", "http://p:3128", ("10.0.0.0/8", "hub.site"))
    env = route.env()
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://p:3128"
    assert env["HTTP_PROXY"] == env["http_proxy"] == "http://p:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "10.0.0.0/8,hub.site"
    assert DIRECT.env() == {}


# llmgw.download through a forward proxy.


@pytest.fixture
async def upstream() -> AsyncIterator[TestServer]:
    async def file(_: web.Request) -> web.Response:
        return web.Response(body=DATA)

    app = web.Application()
    app.router.add_get("/f/model.gguf", file)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


@pytest.fixture
async def forward() -> AsyncIterator[ForwardProxy]:
    p = ForwardProxy()
    await p.start()
    yield p
    await p.close()


def _with_password(url: str) -> str:
    return url.replace("http://", f"http://hub-user:{SECRET}@")


async def test_a_download_goes_through_the_proxy_with_its_credentials(
    upstream: TestServer, forward: ForwardProxy, tmp_path: Path
) -> None:
    route = Route(http=_with_password(forward.url))
    url = str(upstream.make_url("/f/model.gguf"))
    async with aiohttp.ClientSession() as s:
        sha = await download.fetch(s, url, BlobStore(tmp_path), WANT, route=route)
    assert sha == WANT.sha256
    ((method, target, auth),) = forward.seen
    assert (method, target) == ("GET", url)
    assert base64.b64decode(auth.removeprefix("Basic ")).decode() == f"hub-user:{SECRET}"


async def test_a_host_no_proxy_names_is_reached_straight(
    upstream: TestServer, forward: ForwardProxy, tmp_path: Path
) -> None:
    route = Route(http=forward.url, no_proxy=("127.0.0.0/8",))
    url = str(upstream.make_url("/f/model.gguf"))
    async with aiohttp.ClientSession() as s:
        assert await download.fetch(s, url, BlobStore(tmp_path), WANT, route=route)
    assert forward.seen == []


async def test_a_proxy_that_refuses_is_said_so_without_its_password(
    forward: ForwardProxy, tmp_path: Path
) -> None:
    forward.refuse = 403
    route = Route(https=_with_password(forward.url))
    async with aiohttp.ClientSession() as s:
        with pytest.raises(DownloadError) as e:
            await download.fetch(s, "https://hub.example:8443/f/model.gguf", BlobStore(tmp_path),
                                 WANT, route=route, attempts=2, backoff_s=0.01)  # fmt: skip
    shown = forward.url.replace("http://", "http://****@")
    assert f"proxy {shown} refused the connection to hub.example:8443: 403" in str(e.value)
    assert SECRET not in str(e.value)
    assert forward.targets() == ["hub.example:8443", "hub.example:8443"]
    method, _, auth = forward.seen[0]  # the credentials went to the proxy, in its CONNECT
    assert method == "CONNECT"
    assert base64.b64decode(auth.removeprefix("Basic ")).decode() == f"hub-user:{SECRET}"


async def test_a_proxy_that_cannot_be_reached_is_said_so(tmp_path: Path) -> None:
    closed = ForwardProxy()
    await closed.start()
    await closed.close()  # nothing listens there any more
    route = Route(https=closed.url)
    async with aiohttp.ClientSession() as s:
        with pytest.raises(DownloadError) as e:
            await download.fetch(s, "https://huggingface.co/f/model.gguf", BlobStore(tmp_path),
                                 WANT, route=route, attempts=1)  # fmt: skip
    assert f"proxy {closed.url} cannot be reached (to huggingface.co)" in str(e.value)


def test_redact_hides_every_url_password() -> None:
    text = proxy.redact(f"via http://u:{SECRET}@p:3128 and https://tok@idx/simple")
    assert text == "via http://****@p:3128 and https://****@idx/simple"


@pytest.mark.parametrize("password", ["S3cr@tP@ss", "a/b@c", "p:w@rd"])
def test_redact_hides_a_password_holding_at_signs_or_slashes(password: str) -> None:
    text = proxy.redact(f"proxy 'http://svc:{password}@proxy:3128' refused")
    assert text == "proxy 'http://****@proxy:3128' refused"


@pytest.mark.parametrize("main", [llmgwd_main.main, agentd_main.main])
def test_a_daemon_with_an_unusable_environment_proxy_exits_78_without_its_password(
    main: Callable[[list[str] | None], None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "c.yaml").write_text("log_level: info\n")
    monkeypatch.setenv("HTTPS_PROXY", f"socks5://user:{SECRET}@p:1080")
    with pytest.raises(SystemExit) as e:
        main(["--check", "--config", str(tmp_path / "c.yaml")])
    assert e.value.code == 78
    err = capsys.readouterr().err
    assert "HTTPS_PROXY/HTTP_PROXY in the environment" in err and "socks5://****@p:1080" in err
    assert SECRET not in err
