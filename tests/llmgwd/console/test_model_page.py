"""The console's serve form and model card as a browser sees them: the preview's figures are
GET /api/v1/models/{name}/plan's, a model added by the form is the one POST /api/v1/models
stores, each role is drawn only the forms the rule table allows, and the card shows every
profile with its replicas."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import msgspec
import pytest

from llmgw import wire
from llmgw.api_types import PlanView, Verdict
from llmgwd.api.base import NodeInfo
from llmgwd.api.routes import TABLE
from llmgwd.catalog import Model, profiles_of
from llmgwd.console.forms import MODEL_FORMS, SERVE_FORMS
from llmgwd.console.headers import CSP
from llmgwd.people.records import STAFF_ROLES
from llmgwd.placement.profiles import Profile
from llmgwd.placement.reconciler import Failure, NodeFlags
from llmgwd.placement.scheduler import Placement
from tests.llmgwd.console.console_site import Browser, Forms, Site, csrf_of, serving

CPU = Verdict("n1", "cores", True, 8192, 3 << 30, 2.5, "fits at 8192 tokens", slots=3)
SHORT = Verdict("n2", "cores", True, 4096, 2 << 30, 40.0, "fits at 4096 tokens", slots=4)
FULL = Verdict("n3", "", False, reason="cordoned: it takes no new replicas")
CARD = Verdict("n4", "GPU-0 (H100)", True, 32768, 20 << 30, 0.0, "fits")


class Plans:
    """The reconciler's answers the plan route reads, set by the test."""

    def __init__(self) -> None:
        self.verdicts: dict[str, list[Verdict]] = {}  # per profile
        self.placed: list[Placement] = []
        self.rolling = ""  # what rollout() answers

    def awake(self, model: Model) -> bool:
        return True

    def flags(self, node: str) -> NodeFlags:
        return NodeFlags()

    async def set_flags(self, node: str, flags: NodeFlags) -> None:
        raise AssertionError("not asked")

    def placements(self) -> list[Placement]:
        return list(self.placed)

    def failures(self) -> list[Failure]:
        return []

    def explain(self, model: Model) -> list[tuple[Profile, list[Verdict]]]:
        return [(p, list(self.verdicts.get(p.name, []))) for p in profiles_of(model)]

    def rollout(self, model: Model) -> str:
        return self.rolling


@pytest.fixture
def plans() -> Plans:
    p = Plans()
    p.verdicts = {"default": [CPU, SHORT, FULL], "gpu": [CARD], "cpu": [CPU]}
    return p


@pytest.fixture
async def site(plans: Plans) -> AsyncIterator[Site]:
    async with serving(scheduling=plans) as s:
        yield s


@pytest.fixture
async def browser(site: Site) -> AsyncIterator[Browser]:
    b = Browser(site)
    yield b
    await b.close()


async def api(site: Site, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """/api/v1 as the CLI sends it, with the admin's key."""
    headers = {"Authorization": f"Bearer {site.keys['admin']}"}
    data = msgspec.json.encode(body) if body is not None else None
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, site.url + "/api/v1" + path, data=data, headers=headers) as r,
    ):
        return r.status, await r.json()


def figures(html: str, cls: str) -> list[str]:
    """The values of a page's <data class=cls> figures, in order."""
    return re.findall(rf'<data class="{cls}" value="([^"]*)"', html)


async def test_the_preview_shows_the_plan_routes_figures(
    browser: Browser, site: Site, plans: Plans
) -> None:
    await browser.sign_in("operator")
    query = urlencode({"name": "smol", "source": "file:/m/smol.gguf"})
    status, raw = await api(site, "GET", "/models/smol/plan")
    plan = msgspec.convert(raw, PlanView)
    fits = [v for v in plan.profiles[0].verdicts if v.fits]
    top = max(fits, key=lambda v: v.context)
    for hx in ({}, {"HX-Request": "true"}):  # the page, and htmx's preview alone
        path = "/console/serve/plan?" if hx else "/console/serve?"
        async with browser.session.get(site.url + path + query, headers=hx) as r:
            html = await r.text()
        assert html.startswith('<section id="plan"') == bool(hx)
        assert r.status == 200 and status == 200
        assert figures(html, "context") == [str(top.context)] == ["8192"]
        assert figures(html, "slots") == [str(top.slots)] == ["3"]  # at that context, there
        assert figures(html, "memory") == [str(top.memory_bytes)]
        assert figures(html, "speed") == [str(top.tokens_per_s)]
        assert "cordoned: it takes no new replicas" in html  # every node, as the CLI's table
    # 1024 tokens at 2.5 tokens/s: about 7 minutes, so serving asks first
    assert "would take about 6.8 minutes on n1" in html
    serve = next(f for f in Forms(html).forms if f.get("route", "").endswith("/serve"))
    assert serve["path.name"] == "smol"
    assert re.search(r'<input id="p-slow" type="checkbox" required>', html)
    plans.verdicts["default"] = [SHORT]  # 1024 tokens at 40/s: 26 s, nothing to ask
    r, _ = await browser.get("/console/serve/plan?" + query)  # no htmx: the whole page
    assert r.status == 303 and r.headers["Location"] == "/console/serve?" + query
    _, html = await browser.get("/console/serve?" + query)
    assert "minutes" not in html and 'type="checkbox" required' not in html


async def test_a_new_model_s_preview_is_post_models_plan_s_without_adding_it(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("operator")
    body = {"name": "qwen2.5", "source": "file:/m/q.gguf", "engine": "llama.cpp"}
    status, raw = await api(site, "POST", "/models/plan", body)
    plan = msgspec.convert(raw, PlanView)
    top = max((v for v in plan.profiles[0].verdicts if v.fits), key=lambda v: v.context)
    _, html = await browser.get("/console/serve?" + urlencode(body))
    assert status == 200 and figures(html, "context") == [str(top.context)] == ["8192"]
    assert figures(html, "speed") == [str(top.tokens_per_s)]
    assert "/m/q.gguf is not on the control plane: placed by count only" in html
    assert any(f.get("route") == "POST /models" for f in Forms(html).forms)
    assert site.catalog.get("qwen2.5") is None  # previewed, not added


async def test_the_form_adds_the_model_post_models_would(browser: Browser, site: Site) -> None:
    await browser.sign_in("operator")
    inputs = {"name": "qwen2.5", "source": "file:/m/q.gguf", "context": "4096"}
    _, html = await browser.get("/console/serve?" + urlencode(inputs | {"max_tokens": "512"}))
    assert "qwen2.5 is not in the catalog" in html
    add = next(f for f in Forms(html).forms if f.get("route") == "POST /models")
    assert add["body.source"] == "file:/m/q.gguf" and add["back"] == "/console/models/qwen2.5"
    r, _ = await browser.post("/console/act", add)
    assert r.status == 303 and r.headers["Location"] == "/console/models/qwen2.5"
    status, _ = await api(site, "POST", "/models", {
        "name": "qwen2.5-cli", "source": "file:/m/q.gguf", "engine": "llama.cpp",
        "context": 4096, "max_tokens": 512,
    })  # fmt: skip
    assert status == 201
    by_form, by_cli = site.catalog.get("qwen2.5"), site.catalog.get("qwen2.5-cli")
    assert by_form is not None and by_cli is not None
    skip = {"name", "created_at"}
    fields = [f for f in by_form.__struct_fields__ if f not in skip]
    assert {f: getattr(by_form, f) for f in fields} == {f: getattr(by_cli, f) for f in fields}
    # then served from its card, as `llmgw model serve` does
    _, html = await browser.get("/console/models/qwen2.5")
    serve = next(f for f in Forms(html).forms if f.get("route", "").endswith("/serve"))
    r, _ = await browser.post("/console/act", serve | {"body.replicas": "2"})
    model = site.catalog.get("qwen2.5")
    assert r.status == 303 and model is not None and model.replicas == 2


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("ftp://x/y.gguf", "source"),
        ("file://etc/passwd", "source"),
        ("hf:not a repo", "source"),
    ],
)
async def test_a_bad_source_is_the_console_s_400(
    browser: Browser, site: Site, source: str, words: str
) -> None:
    await browser.sign_in("operator")
    r, html = await browser.get("/console/serve?" + urlencode({"name": "x", "source": source}))
    assert r.status == 400 and words in html and '<p class="refusal" role="alert">' in html
    assert r.headers["Content-Security-Policy"] == CSP
    _, page = await browser.get("/console/serve")
    form = {"csrf": csrf_of(page), "route": "POST /models", "body.name": "x"}
    r, html = await browser.post(
        "/console/act", form | {"body.source": source, "body.engine": "llama.cpp"}
    )
    assert r.status == 400 and words in html and site.catalog.get("x") is None


def _allowed(role: str, method: str, path: str) -> bool:
    route = next(r for r in TABLE if (r.method, r.path) == (method, path))
    return role in STAFF_ROLES and role in route.rule.staff


@pytest.mark.parametrize("role", ["admin", "operator", "viewer"])
async def test_each_role_is_drawn_the_card_s_and_serve_forms_the_rules_allow(
    browser: Browser, site: Site, role: str
) -> None:
    await browser.sign_in(role)
    r, html = await browser.get("/console/models/smol")
    assert r.status == 200 and r.headers["Content-Security-Policy"] == CSP
    assert "<script>" not in html and " style=" not in html
    drawn = sorted(f["route"] for f in Forms(html).forms if "route" in f)
    card = [*MODEL_FORMS, *SERVE_FORMS[2:]]  # the model's, a profile's, a new profile's
    want = sorted(f"{f.method} {f.path}" for f in card if _allowed(role, f.method, f.path))
    assert drawn == want and bool(want) == (role != "viewer")
    _, html = await browser.get("/console/serve?name=new&source=hf:o/r")
    drawn = sorted(f["route"] for f in Forms(html).forms if "route" in f)
    assert drawn == (["POST /models"] if _allowed(role, "POST", "/models") else [])
    _, html = await browser.get("/console/serve?name=smol&source=file:/m/smol.gguf")
    drawn = sorted(f["route"] for f in Forms(html).forms if "route" in f)
    serve = "POST /models/{name}/serve"
    assert drawn == ([serve] if _allowed(role, "POST", "/models/{name}/serve") else [])


async def test_a_viewer_s_forged_add_gets_the_guard_s_403(browser: Browser, site: Site) -> None:
    await browser.sign_in("viewer")
    _, html = await browser.get("/console/serve")
    form = {"csrf": csrf_of(html), "route": "POST /models", "body.name": "forged",
            "body.source": "file:/m/f.gguf", "body.engine": "llama.cpp"}  # fmt: skip
    r, page = await browser.post("/console/act", form)
    assert r.status == 403 and "may not POST /api/v1/models" in page
    assert site.catalog.get("forged") is None
    form = {"csrf": csrf_of(html), "route": "POST /models/{name}/replicas", "path.name": "smol",
            "body.profile": "default", "body.replicas": "5"}  # fmt: skip
    r, _ = await browser.post("/console/act", form)
    model = site.catalog.get("smol")
    assert r.status == 403 and model is not None and model.replicas == 1


async def test_the_card_shows_every_profile_with_its_replicas(
    browser: Browser, site: Site, plans: Plans
) -> None:
    await browser.sign_in("operator")
    gpu = Profile(name="gpu", kind="gpu", replicas=2, priority=10)
    cpu = Profile(name="cpu", kind="cpu", replicas=1, cores=4)
    await site.catalog.update_model("smol", profiles=[gpu, cpu], replicas=3)
    plans.placed = [
        Placement("smol-a", "smol", "n4", "gpu", ["GPU-0"], 32768, 20 << 30),
        Placement("smol-b", "smol", "n4", "gpu", ["GPU-1"], 32768, 20 << 30),
        Placement("smol-c", "smol", "n1", "cpu", [], 8192, 3 << 30),
    ]
    reps = [("smol-a", "n4", "ready", 4), ("smol-b", "n4", "starting", 0),
            ("smol-c", "n1", "ready", 1)]  # fmt: skip
    site.nodes.items = [
        NodeInfo(name=node, address="a", connected=True, last_seen=1, cores=8,
                 memory_bytes=1 << 30,
                 replicas=[wire.ReplicaStatus(i, "smol", state, slots=s)  # type: ignore[arg-type]
                           for i, n, state, s in reps if n == node])
        for node in ("n1", "n4")
    ]  # fmt: skip
    r, html = await browser.get("/console/models/smol")
    assert r.status == 200
    rows = re.findall(
        r'<tr data-profile="([^"]+)">.*?class="wanted" value="(\d+)".*?class="ready" value="(\d+)"',
        html,
        re.S,
    )
    assert rows == [("gpu", "2", "1"), ("cpu", "1", "1")]
    for rid, node, state, _ in reps:
        assert re.search(rf"<th scope=\"row\">{rid}</th><td>{'gpu' if node == 'n4' else 'cpu'}"
                         rf"</td><td><a href=\"/console/nodes/{node}\">{node}</a></td>\s*"
                         rf"<td><span class=\"state-{state}\">", html), rid  # fmt: skip
    assert figures(html, "context") == ["32768", "8192"]  # each profile's plan, beside it
    per_profile = [f for f in Forms(html).forms if f.get("body.profile")]
    assert [f["body.profile"] for f in per_profile] == ["gpu", "cpu"]
    r, _ = await browser.post("/console/act", per_profile[1] | {"body.replicas": "3"})
    model = site.catalog.get("smol")
    assert r.status == 303 and model is not None
    assert [(p.name, p.replicas) for p in model.profiles] == [("gpu", 2), ("cpu", 3)]
    hx = {"HX-Request": "true"}
    async with browser.session.get(site.url + "/console/models/smol", headers=hx) as live:
        part = await live.text()
    assert part.startswith('<div id="live"') and "smol-c" in part and "<form" not in part


async def test_the_card_changes_context_and_removes_with_its_files_option(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("operator")
    _, html = await browser.get("/console/models/smol")
    context = next(f for f in Forms(html).forms if f.get("route", "").endswith("/context"))
    r, _ = await browser.post("/console/act", context | {"body.context": "2048"})
    model = site.catalog.get("smol")
    assert r.status == 303 and r.headers["Location"] == "/console/models/smol"
    assert model is not None and model.context == 2048
    assert 'name="query.files" value="true"' in html
    remove = next(f for f in Forms(html).forms if f.get("route", "").startswith("DELETE"))
    r, _ = await browser.post("/console/act", remove)
    assert r.status == 303 and r.headers["Location"] == "/console/models"
    assert site.catalog.get("smol") is None
    r, _ = await browser.get("/console/models/smol")
    assert r.status == 404


async def test_the_card_sets_the_longest_answer_and_restarts(browser: Browser, site: Site) -> None:
    await browser.sign_in("operator")
    _, html = await browser.get("/console/models/smol")
    by_route = {f.get("route", ""): f for f in Forms(html).forms}
    assert 'type="number" name="body.max_tokens" value="0"' in html  # the model's value now
    longest = by_route["PUT /models/{name}/max_tokens"]
    r, _ = await browser.post("/console/act", longest | {"body.max_tokens": "256"})
    assert r.status == 303 and r.headers["Location"] == "/console/models/smol"
    r, _ = await browser.post("/console/act", by_route["POST /models/{name}/restart"])
    assert r.status == 303
    model = site.catalog.get("smol")
    assert model is not None and (model.max_tokens, model.generation) == (256, 1)
    _, html = await browser.get("/console/models/smol")
    assert 'type="number" name="body.max_tokens" value="256"' in html


async def test_the_card_says_a_restart_or_context_rolls_and_how_far_it_got(
    browser: Browser, site: Site, plans: Plans
) -> None:
    await browser.sign_in("operator")
    _, html = await browser.get("/console/models/smol")
    assert "A restart or a new context replaces the replicas one at a time" in html
    assert "New settings:" not in html  # no roll runs
    plans.rolling = "replacing 1 replica for the new settings, one at a time (it restarts in place)"
    _, html = await browser.get("/console/models/smol")
    assert f'<p class="rollout">New settings: {plans.rolling}.</p>' in html
    plans.rolling = "halted: replica smol-1 failed to start with the new settings on n1 (exit)"
    _, html = await browser.get("/console/models/smol")
    assert f'<p class="rollout bad">New settings: {plans.rolling}.</p>' in html


async def test_a_gpu_profile_s_cards_change_from_its_form_and_a_cpu_one_has_none(
    browser: Browser, site: Site
) -> None:
    await browser.sign_in("operator")
    gpu = Profile(name="gpu", kind="gpu", replicas=1, priority=10, gpus=3)
    cpu = Profile(name="cpu", kind="cpu", replicas=1, cores=4)
    await site.catalog.update_model("smol", profiles=[gpu, cpu], replicas=2)
    _, html = await browser.get("/console/models/smol")
    shown = re.findall(r'name="body\.gpus" value="(\d+)"', html)
    assert shown == ["3"]  # the gpu profile's own cards; the cpu profile's form has no such input
    per_profile = {f["body.profile"]: f for f in Forms(html).forms if f.get("body.profile")}
    form = per_profile["gpu"] | {"body.replicas": "1", "body.gpus": "2"}
    r, _ = await browser.post("/console/act", form)
    model = site.catalog.get("smol")
    assert r.status == 303 and model is not None
    assert [(p.name, p.replicas, p.gpus) for p in model.profiles] == [
        ("gpu", 1, 2),
        ("cpu", 1, 1),
    ]
