"""Every llmgw command, read from the click tree, is either host-local (llmgw.cli.common's
HOST_LOCAL, with why) or run here over a context's HTTPS, reaching its /api/v1 route with
the socket pointed nowhere: a new command that is neither fails."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from llmgw.cli.common import EXIT_UNREACHABLE, HOST_LOCAL
from llmgw.cli.main import main
from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_app
from llmgwd.catalog import Catalog
from llmgwd.providers.credentials import Credentials
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw import test_cli_contexts
from tests.llmgw.https_site import ADMIN_SECRET, WithAdmin, add_context, make_tls, start_tls_site
from tests.llmgw.test_cli import JOIN_URL, FakeNodes

# Over HTTPS in a test of their own, as they need an OIDC provider or a session.
ELSEWHERE = {
    "login": "test_login_signs_in_at_the_context_trusting_its_pinned_ca",
    "logout": "test_each_context_has_its_own_session_until_logout",
}

# Each command's arguments here ({tmp}: a folder with files) and the route it must reach.
OVER_HTTPS: dict[str, tuple[str, str]] = {
    "backup": ("backup {tmp}/b.llmgw --passphrase-file {tmp}/pass", "POST /backup"),
    "key create": ("key create k1", "POST /keys"),
    "key limits": ("key limits k1 --rpm 5", "PATCH /keys/{key}/limits"),
    "key revoke": ("key revoke k1", "DELETE /keys/{key}"),
    "keys": ("keys", "GET /keys"),
    "limits set": ("limits set --user u1 --rpm 5", "PATCH /users/{user}/limits"),
    "limits show": ("limits show --user u1", "GET /users/{user}/limits"),
    "metrics token": ("metrics token", "POST /metrics/token"),
    "mirror add-peer": ("mirror add-peer https://peer.example:7700/hf", "POST /mirror/peers"),
    "mirror import": ("mirror import {tmp}/set --as org/set", "PUT /mirror/uploads/{sha256}"),
    "mirror status": ("mirror status", "GET /mirror"),
    "mirror sweep": ("mirror sweep --dry-run", "POST /mirror/sweep"),
    "model add": ("model add m1 --from file:/srv/m1.gguf", "POST /models"),
    "model context": ("model context m1 8192", "PUT /models/{name}/context"),
    "model max-tokens": ("model max-tokens m1 512", "PUT /models/{name}/max_tokens"),
    "model plan": ("model plan m1", "GET /models/{name}/plan"),
    "model price": ("model price m1 --prompt 1 --completion 2", "PUT /models/{name}/price"),
    "model remove": ("model remove m1", "DELETE /models/{name}"),
    "model replicas": ("model replicas m1 1 --profile p", "POST /models/{name}/replicas"),
    "model restart": ("model restart m1", "POST /models/{name}/restart"),
    "model serve": ("model serve m1 --replicas 1", "POST /models/{name}/serve"),
    "model stop": ("model stop m1", "POST /models/{name}/stop"),
    "models": ("models", "GET /models"),
    "node cordon": ("node cordon n1", "POST /nodes/{name}/{action}"),
    "node drain": ("node drain n1", "POST /nodes/{name}/{action}"),
    "node remove": ("node remove n1 --yes", "DELETE /nodes/{name}"),
    "node token": ("node token", "POST /tokens"),
    "node uncordon": ("node uncordon n1", "POST /nodes/{name}/{action}"),
    "nodes": ("nodes", "GET /nodes"),
    "org create": ("org create acme", "POST /orgs"),
    "org delete": ("org delete acme --yes", "DELETE /orgs/{org}"),
    "org member": ("org member acme u1 member", "PUT /orgs/{org}/members/{user}"),
    "org project": ("org project acme p1", "POST /orgs/{org}/projects"),
    "org show": ("org show acme", "GET /orgs/{org}/teams"),
    "org team": ("org team acme t1", "POST /orgs/{org}/teams"),
    "org unmember": ("org unmember acme u1", "DELETE /orgs/{org}/members/{user}"),
    "orgs": ("orgs", "GET /orgs"),
    "plane remove": ("plane remove cp2", "DELETE /planes/{name}"),
    "plane token": ("plane token", "POST /planes/tokens"),
    "planes": ("planes", "GET /planes"),
    "provider add": (
        "provider add p1 --protocol openai --url https://api.example/v1 --model gpt "
        "--credential-file {tmp}/pass",
        "POST /providers",
    ),
    "provider remove": ("provider remove p1", "DELETE /providers/{name}"),
    "providers": ("providers", "GET /providers"),
    "scim token": ("scim token", "POST /scim/token"),
    "slurm lend": ("slurm lend n1", "POST /slurm/nodes/{name}/{action}"),
    "slurm off": ("slurm off", "PUT /slurm"),
    "slurm reclaim": ("slurm reclaim n1", "POST /slurm/nodes/{name}/{action}"),
    "slurm setup": ("slurm setup --controller n1 --all-nodes", "PUT /slurm"),
    "slurm status": ("slurm status", "GET /slurm"),
    "status": ("status", "GET /status"),
    "upgrade abort": ("upgrade abort", "POST /upgrade/{action}"),
    "upgrade resume": ("upgrade resume", "POST /upgrade/{action}"),
    "upgrade stage": ("upgrade stage {tmp}/pass", "PUT /upgrade/packages/{sha256}"),
    "upgrade start": ("upgrade start", "POST /upgrade/start"),
    "upgrade status": ("upgrade status", "GET /upgrade"),
    "usage": ("usage", "GET /usage"),
    "user approve": ("user approve u1", "POST /users/{user}/approve"),
    "user create": ("user create u1", "POST /users"),
    "user delete": ("user delete u1 --yes", "DELETE /users/{user}"),
    "user set": ("user set u1 --inactive", "PATCH /users/{user}"),
    "user staff": ("user staff u1 viewer", "PUT /users/{user}/staff"),
    "users": ("users", "GET /users"),
    "version": ("version", "GET /status"),
}


def commands(group: click.Group = main, path: str = "") -> list[str]:
    """Every command's path under group, hidden ones (old names of listed ones) left out."""
    found: list[str] = []
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        full = f"{path} {name}".strip()
        if isinstance(command, click.Group):
            found += commands(command, full)
        else:
            found.append(full)
    return found


@dataclass
class Served:
    """The API over HTTPS on a loop of its own, and each request's "METHOD route" and status."""

    tmp: Path
    env: dict[str, str]
    seen: list[tuple[str, int]] = field(default_factory=list)

    def cli(self, *args: str) -> Result:
        none = str(self.tmp / "no.sock")  # the local sockets lead nowhere
        base = ["--socket", none, "--agent-socket", none]
        return CliRunner().invoke(main, [*base, *args], env=self.env)


def _recorder(seen: list[tuple[str, int]]) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def record(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            resource = request.match_info.route.resource
            rule = resource.canonical.removeprefix("/api/v1") if resource else "-"
            seen.append((f"{request.method} {rule}", status))

    return record


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("every")
    (tmp / "pass").write_text("a passphrase of the tests\n")
    (tmp / "set").mkdir()
    (tmp / "set" / "config.json").write_text("{}")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    tls, it = make_tls(tmp), Served(tmp, {"XDG_CONFIG_HOME": str(tmp / "config")})

    async def start() -> tuple[SqliteStore, web.AppRunner, str]:
        store = await SqliteStore.open(":memory:")
        catalog = Catalog(store)
        await catalog.load()
        secret = Credentials(b"the-tests-secret")
        ctx = ApiContext(catalog=catalog, nodes=FakeNodes(), mint_token=lambda: "t",
                         join_url=JOIN_URL, credentials=secret)  # fmt: skip
        app = api_app(ctx, key_auth(WithAdmin(catalog)))
        app.middlewares.append(_recorder(it.seen))
        return store, *await start_tls_site(app, tls.server)

    store, runner, url = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    (tmp / "admin.key").write_text(ADMIN_SECRET)
    add_context(tmp / "config", "test", url, "--ca-fingerprint", tls.fingerprint,
                "--key-file", str(tmp / "admin.key"))  # fmt: skip
    it.env["LLMGW_CONTEXT"] = "test"
    yield it
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    asyncio.run_coroutine_threadsafe(store.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.mark.parametrize("path", commands())
def test_every_command_is_host_local_or_works_over_https(served: Served, path: str) -> None:
    if path in HOST_LOCAL:
        assert HOST_LOCAL[path], f"{path}: host-local says why"
        return
    if path in ELSEWHERE:
        assert hasattr(test_cli_contexts, ELSEWHERE[path]), ELSEWHERE[path]
        return
    assert path in OVER_HTTPS, f"llmgw {path} is neither host-local nor run here over HTTPS"
    args, route = OVER_HTTPS[path]
    served.seen.clear()
    r = served.cli(*args.format(tmp=served.tmp).split())
    reached = dict(served.seen)
    assert route in reached, f"llmgw {args}: {r.output} (the server saw {served.seen})"
    assert reached[route] not in (401, 403), f"llmgw {args}: the admin key was not taken"
    assert r.exit_code != EXIT_UNREACHABLE and not isinstance(r.exception, OSError), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception


def test_the_host_local_list_names_commands_that_exist() -> None:
    assert set(HOST_LOCAL) <= set(commands())
