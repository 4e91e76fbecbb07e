"""The console's OIDC sign-in in a real browser (Debian's chromium driven by Playwright) against
a real llmgwd under systemd and npm's oidc-provider (which requires PKCE and checks the redirect
URI): an organization's admin signs in at the provider and lands on their organization's page,
the session's cookie sent after the provider's cross-site redirect, with no staff page in the
navigation; there they make a project and a key of theirs through the forms, the key's secret
shown once and working on /v1 and /api/v1; making an organization is a staff admin's form
(POST /orgs: STAFF_ADMIN), drawn for one and not for an organization's admin; an answer of no
sign-in begun here is the 400 page; deactivated, they are out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from integration.harness import PrivateSystemd
from integration.llmgw_node import Node, llama_server
from tests.llmgwd.people import npm_oidc

CLIENT_PORT, CLUSTER_PORT = 17940, 17950  # apart from the other integration tests' ports
SECRET_IN = "/etc/llmgw/oidc-client-secret"
# localhost, not the provider's 127.0.0.1: another site, as a provider is (ports are no part
# of a site), so the browser treats the provider's redirect back as a cross-site navigation
CONSOLE = f"http://localhost:{CLIENT_PORT}/console"
CALLBACK = CONSOLE + "/login/oidc/callback"
STAFF_LINKS = ("Overview", "Models", "Nodes", "GPU map", "Mirror", "Slurm")


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("oidc") / "client-secret"
    path.write_text("llmgw-console-secret-83a0\n")
    return path


@pytest.fixture(scope="module")
def issuer(secret_file: Path) -> Iterator[str]:
    """npm's oidc-provider on the host's loopback, the console's callback registered."""
    with npm_oidc.running(secret_file, redirect_uris=(CALLBACK,)) as url:
        claims = {"preferred_username": "ada", "email": "ada@acme.example"}
        npm_oidc.put_account(url, "ada-sub", claims | {"groups": ["acme-admins"]})
        npm_oidc.put_account(url, "grace-sub", {"preferred_username": "grace", "groups": []})
        yield url


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd, issuer: str, secret_file: Path) -> Node:
    """llmgwd alone (no model is needed to sign in), signing in at the provider."""
    n = Node(systemd, CLIENT_PORT, CLUSTER_PORT)
    n.install(llama_server(), address="")
    systemd.write_file(SECRET_IN, secret_file.read_text(), mode=0o640)
    systemd.run(["chown", "root:llmgw", SECRET_IN])
    n.init_server(
        agent=False,
        extra=(
            f"oidc:\n  issuer: {issuer}\n  client_id: llmgw\n  client_secret_file: {SECRET_IN}\n"
            "  rules:\n    - {group: acme-admins, org: acme, role: admin}\n"
        ),
    )
    n.llmgw("org", "create", "acme")
    n.llmgw("user", "create", "grace", "--external-id", "grace-sub")
    n.llmgw("user", "staff", "grace", "admin")
    return n


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.set_default_timeout(20_000)
    violations: list[str] = []
    p.on("console", lambda m: violations.append(m.text) if "Content Security" in m.text else None)
    yield p
    context.close()
    assert not violations, violations


def sign_in_at_provider(page: Page, issuer: str, sub: str) -> None:
    """From the console's sign-in page, through the provider's, as sub."""
    page.goto(CONSOLE + "/")
    assert page.url == CONSOLE + "/login"
    host = issuer.removeprefix("http://")
    page.get_by_role("link", name=f"Sign in with {host}").click()
    page.wait_for_url(issuer + "/interaction/**")
    page.locator("input[name=sub]").fill(sub)
    page.get_by_role("button", name="sign in").click()


def test_an_org_admin_signs_in_at_the_provider_and_lands_on_their_org(
    node: Node, issuer: str, page: Page
) -> None:
    sign_in_at_provider(page, issuer, "ada-sub")
    page.wait_for_url(CONSOLE + "/org/acme")
    assert page.get_by_role("heading", name="acme").first.is_visible()
    nav = page.get_by_role("navigation", name="Console")
    assert nav.get_by_role("link", name="Organization").is_visible()
    for name in STAFF_LINKS:
        assert nav.get_by_role("link", name=name).count() == 0, name
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["llmgw_console"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert "llmgw_console_oidc" not in cookies  # used once, dropped
    [user] = [u for u in node.llmgw("user", "list", "--json") if u["name"] == "ada"]
    assert user["source"] == "oidc"


def test_an_answer_of_no_sign_in_begun_here_is_refused(node: Node, page: Page) -> None:
    r = page.goto(CALLBACK + "?code=forged&state=forged-state-of-another-sign-in")
    assert r is not None and r.status == 400
    assert "not the one begun here" in page.locator("main").inner_text()
    assert not [c for c in page.context.cookies() if c["name"] == "llmgw_console"]


def test_a_deactivated_user_is_out_of_the_console_at_once(
    node: Node, issuer: str, page: Page
) -> None:
    sign_in_at_provider(page, issuer, "ada-sub")
    page.wait_for_url(CONSOLE + "/org/acme")
    node.llmgw("user", "set", "ada", "--inactive")
    try:
        page.reload()
        assert page.url == CONSOLE + "/login"
    finally:
        node.llmgw("user", "set", "ada", "--active")


def api(node: Node, path: str, key: str) -> httpx.Response:
    """GET path on the client port with key as the bearer."""
    url = f"http://127.0.0.1:{node.client_port}{path}"
    return httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_an_org_admin_makes_a_project_and_a_key_shown_once_that_works(
    node: Node, issuer: str, page: Page
) -> None:
    sign_in_at_provider(page, issuer, "ada-sub")
    page.wait_for_url(CONSOLE + "/org/acme")
    adding = page.locator("form", has=page.get_by_role("button", name="Add project"))
    adding.get_by_label("Name").fill("lab")
    adding.get_by_label("Title").fill("The lab")
    adding.get_by_role("button", name="Add project").click()
    page.wait_for_url(CONSOLE + "/org/acme")
    lab = page.locator(".card", has=page.get_by_role("heading", name="The lab"))
    assert "No keys." in lab.get_by_role("table", name="Keys of lab").inner_text()
    making = lab.locator("form", has=page.get_by_role("button", name="Make my key"))
    making.get_by_label("Key name").fill("ada-lab")
    making.get_by_role("button", name="Make my key").click()
    page.wait_for_url(CONSOLE + "/made")
    assert page.get_by_role("heading", name="Key ada-lab made").is_visible()
    secret = page.locator("#secret").inner_text().strip()
    assert secret.startswith("sk-llmgw-") and len(secret) > 40
    assert "acme/lab" in page.locator("main").inner_text()
    r = page.reload()  # the form sent again: a 409, never a second secret or the first
    assert r is not None and r.status == 409
    assert secret not in page.content()
    page.goto(CONSOLE + "/org/acme")
    assert secret not in page.content()
    keys = lab.get_by_role("table", name="Keys of lab").inner_text()
    assert "ada-lab" in keys and "live" in keys
    mine = api(node, "/api/v1/me/keys", secret)
    assert mine.status_code == 200, mine.text
    [made] = [k for k in mine.json() if k["name"] == "ada-lab"]
    assert (made["org"], made["project"], made["revoked"]) == ("acme", "lab", False)
    assert api(node, "/v1/models", secret).status_code == 200
    assert api(node, "/v1/models", "sk-llmgw-" + "x" * 43).status_code == 401


def test_an_organization_is_made_by_a_staff_admin_not_an_org_admin(
    node: Node, issuer: str, page: Page
) -> None:
    sign_in_at_provider(page, issuer, "ada-sub")
    page.wait_for_url(CONSOLE + "/org/acme")
    page.goto(CONSOLE + "/people")
    assert page.get_by_role("button", name="Add organization").count() == 0
    page.context.clear_cookies()
    sign_in_at_provider(page, issuer, "grace-sub")
    page.wait_for_url(CONSOLE + "/")
    page.goto(CONSOLE + "/people")
    adding = page.locator("form", has=page.get_by_role("button", name="Add organization"))
    adding.get_by_label("Name").fill("globex")
    adding.get_by_label("Title").fill("Globex")
    adding.get_by_role("button", name="Add organization").click()
    page.wait_for_url(CONSOLE + "/people")
    orgs = page.get_by_role("region", name="Organizations")
    assert orgs.get_by_role("link", name="Globex").is_visible()
    made = [o for o in node.llmgw("org", "list", "--json") if o["name"] == "globex"]
    assert [o["title"] for o in made] == ["Globex"]
