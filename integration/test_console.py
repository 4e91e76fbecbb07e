"""The web console in a real browser (Debian's chromium driven by Playwright) against a real
llmgwd serving SmolLM2: sign in with a key, the overview and the models page at 1280 and 390
pixels wide, stop and start the model from its forms, and a form post without its token or
naming no route refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from integration.harness import PrivateSystemd
from integration.llmgw_node import MODEL, Node, gguf, llama_server, serving

CLIENT_PORT = 17900  # not 7700: a quickstart cluster may run on this machine too
CLUSTER_PORT = 17910
WIDTHS = (1280, 390)


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    yield serving(systemd, llama_server(), CLIENT_PORT, CLUSTER_PORT)


@pytest.fixture(scope="module")
def admin_key(node: Node) -> str:
    return str(node.llmgw("key", "create", "console", "--admin", "--json")["key"])


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.set_default_timeout(20_000)
    violations: list[str] = []
    p.on("console", lambda m: violations.append(m.text) if "Content Security" in m.text else None)
    yield p
    context.close()
    assert not violations, violations  # the pages need nothing the policy forbids


def url(path: str) -> str:
    return f"http://127.0.0.1:{CLIENT_PORT}{path}"


def sign_in(page: Page, key: str) -> None:
    page.goto(url("/console"))
    assert page.url.endswith("/console/login")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(url("/console/"))


def shoot(page: Page, name: str, shots: Path) -> None:
    """The page at each width, saved; nothing wider than the window at 390 px."""
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=shots / f"{name}-{width}.png", full_page=True)
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= width, f"{name} is {overflow} px wide at {width}"
    page.set_viewport_size({"width": 1280, "height": 900})


def test_an_admin_signs_in_and_sees_the_cluster(
    node: Node, admin_key: str, page: Page, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shots = tmp_path_factory.mktemp("console-screenshots")
    page.goto(url("/console/login"))
    shoot(page, "login", shots)
    sign_in(page, admin_key)
    hostname = node.ps.run(["hostname"]).stdout.strip()
    assert page.get_by_role("row", name=hostname).is_visible()
    assert "1 / 1" in page.get_by_role("row", name=MODEL).inner_text()
    shoot(page, "overview", shots)
    page.get_by_role("link", name="Models").click()
    assert page.get_by_role("heading", name=MODEL).is_visible()
    shoot(page, "models", shots)
    cookie = next(c for c in page.context.cookies() if c["name"] == "llmgw_console")
    assert (
        cookie["httpOnly"] and cookie["sameSite"] == "Strict" and admin_key not in cookie["value"]
    )


def test_the_model_stops_and_starts_from_its_forms(node: Node, admin_key: str, page: Page) -> None:
    sign_in(page, admin_key)
    page.goto(url("/console/models"))
    page.get_by_role("button", name="Stop", exact=True).click()
    assert page.get_by_role("status").inner_text().startswith("Done: POST")
    node.wait(lambda: node.model()["replicas"] == 0 and not node.engine_units(), "stopped")
    page.get_by_label("Replicas").fill("1")
    page.get_by_role("button", name="Start", exact=True).click()
    assert "serve" in page.get_by_role("status").inner_text()
    node.wait_ready(1)
    page.reload()
    assert "ready" in page.get_by_role("article").inner_text()


def test_a_post_without_the_form_token_or_naming_no_route_is_refused(
    node: Node, admin_key: str, page: Page
) -> None:
    sign_in(page, admin_key)
    form: dict[str, str | float | bool] = {"route": "POST /models/{name}/stop", "path.name": MODEL}
    r = page.request.post(url("/console/act"), form=form, max_redirects=0)
    assert r.status == 403
    token = page.locator("input[name=csrf]").first.get_attribute("value") or ""
    r = page.request.post(
        url("/console/act"), form=form | {"csrf": token, "route": "POST /halt"}, max_redirects=0
    )
    assert r.status == 400
    assert node.model()["replicas"] == 1
    assert r.headers["content-security-policy"].startswith("default-src 'self'")


def test_a_key_for_v1_only_signs_nobody_in(node: Node, page: Page) -> None:
    page.goto(url("/console/login"))
    page.get_by_label("API key").fill(node.key)  # serving()'s key: /v1 only
    page.get_by_role("button", name="Sign in").click()
    assert "/v1 only" in page.get_by_role("alert").inner_text()
    assert not [c for c in page.context.cookies() if c["name"] == "llmgw_console"]


def test_a_model_served_from_the_form_becomes_ready_and_takes_a_new_context(
    node: Node, admin_key: str, page: Page, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shots = tmp_path_factory.mktemp("console-serve-screenshots")
    node.llmgw("model", "stop", MODEL)  # its replica holds every core: room for the new one
    node.wait(lambda: node.model()["replicas"] == 0 and not node.engine_units(), "stopped")
    try:
        _serve_from_the_form(node, admin_key, page, shots)
    finally:
        node.llmgw("model", "remove", "smol2", check=False)
        node.llmgw("model", "serve", MODEL, "--replicas", "1")
        node.wait_ready(1)


def _serve_from_the_form(node: Node, admin_key: str, page: Page, shots: Path) -> None:
    sign_in(page, admin_key)
    page.goto(url("/console/models"))
    page.get_by_role("link", name="Serve a model").click()
    page.get_by_label("Name", exact=True).fill("smol2")
    page.get_by_label("Source").fill(f"file:{gguf()}")
    page.get_by_role("button", name="Preview").click()  # htmx: the preview alone
    page.get_by_role("button", name="Add smol2 to the catalog").click()
    page.wait_for_url(url("/console/models/smol2"))
    plan = node.llmgw("model", "plan", "smol2", "--json")
    fits = [v for v in plan["profiles"][0]["verdicts"] if v["fits"]]
    longest = max(v["context"] for v in fits)
    shown = page.locator("table.plan data.context").first.get_attribute("value")
    assert shown == str(longest) and longest > 0  # the card's figure is the plan's
    slots = max(v["slots"] for v in fits if v["context"] == longest)
    assert page.locator("table.plan data.slots").first.get_attribute("value") == str(slots)
    shoot(page, "model-card", shots)
    page.locator("form.serve").get_by_label("Replicas").fill("1")
    page.locator("form.serve").get_by_role("button", name="Start", exact=True).click()
    assert "serve" in page.get_by_role("status").inner_text()
    node.wait(lambda: node.model("smol2")["ready"] == 1, "smol2 ready", 180)
    # the engine serves the placement's slots: llama-server's /props says as many
    [placed] = node.llmgw("model", "plan", "smol2", "--json")["profiles"][0]["placed"]
    [replica] = node.model("smol2")["replica_status"]
    assert replica["slots"] == placed["slots"] == slots > 0
    page.reload()
    assert page.locator("table.profiles data.ready").first.get_attribute("value") == "1"
    page.get_by_label("Context (tokens; 0: the model's own)").fill("2048")
    page.get_by_role("button", name="Set context").click()
    assert "context" in page.get_by_role("status").inner_text()
    assert node.model("smol2")["context"] == 2048
    assert "2048" in page.locator("dl").inner_text()  # the card shows it
    # a running replica keeps the context it was placed with: stopped and started again
    # from the card, it is placed at the new one
    page.get_by_role("button", name="Stop", exact=True).click()
    node.wait(lambda: not node.model("smol2")["replica_status"], "smol2 stopped")
    page.locator("form.serve").get_by_label("Replicas").fill("1")
    page.locator("form.serve").get_by_role("button", name="Start", exact=True).click()

    def placed_at_2048() -> bool:
        placed = node.llmgw("model", "plan", "smol2", "--json")["profiles"][0]["placed"]
        return [p["context"] for p in placed] == [2048] and node.model("smol2")["ready"] == 1

    node.wait(placed_at_2048, "smol2 ready at 2048 tokens", 180)
