"""The console's application, mounted at /console on the client port beside /v1 and /api/v1."""

from __future__ import annotations

from aiohttp import web

from llmgwd.api.route import ROUTES
from llmgwd.console import (
    act,
    gpu_map,
    made,
    mirror_page,
    model_page,
    nav,
    node_page,
    oidc_signin,
    org_page,
    pages,
    people_page,
    signin,
    slurm_page,
    usage_page,
)
from llmgwd.console.base import (
    CONSOLE,
    HERE,
    PREFIX,
    Console,
    Keys,
    error_pages,
    live_sessions,
    see_other,
    templates,
)
from llmgwd.console.forms import MODEL_FORMS, NODE_FORMS, PROVIDER_FORMS, SERVE_FORMS, Routes
from llmgwd.console.headers import TLS, security_headers, to_https
from llmgwd.console.session import Sessions, derived


def make(
    api: web.Application,
    keys: Keys,
    secret: bytes,
    *,
    tls: bool,
    login: web.Application | None = None,
    public_url: str = "",
) -> Console:
    """The console's context: api, /api/v1's sub-application it sends every request to (and
    whose route table its forms name); secret, the one every control plane shares (a session
    made on one opens on another); tls, whether the client port has TLS; login, the
    /api/v1/login application whose OIDC sign-in the console's uses (with public_url, the
    client port's, for the provider's redirect back)."""
    page_forms = (*mirror_page.MIRROR_FORMS, *slurm_page.SLURM_FORMS)
    every = (*MODEL_FORMS, *SERVE_FORMS, *NODE_FORMS, *page_forms, *people_page.FORMS)
    every = (*every, *org_page.FORMS, *PROVIDER_FORMS)
    # A form naming no route fails here, at start; /console/act sends only these forms' routes,
    # but those that make a secret, which /console/made alone sends.
    table = api[ROUTES]  # the records /api/v1 is served from
    routes = Routes(table, every, people_page.MAKING)
    return Console(
        api=api,
        keys=keys,
        sessions=Sessions(derived(secret, "session"), secure=tls),
        csrf_key=derived(secret, "csrf"),
        routes=routes,
        templates=templates(),
        oidc=oidc_signin.of_login(login, public_url) if login is not None else None,
    )


def console_app(ctx: Console) -> web.Application:
    """The console's pages, forms and static files."""
    # error_pages outermost: a failure checking the session or working out the navigation is
    # its error page too.
    app = web.Application(middlewares=[to_https, error_pages, live_sessions, nav.navigation])
    app.on_response_prepare.append(security_headers)  # every answer, aiohttp's own 500 too
    app[CONSOLE] = ctx
    app[TLS] = ctx.sessions.secure
    app.router.add_get("/", pages.overview)
    app.router.add_get("/models", pages.models_page)
    app.router.add_get("/models/{name}", model_page.model_card)
    app.router.add_get("/serve", model_page.serve_page)
    app.router.add_get("/serve/plan", model_page.serve_plan)
    app.router.add_get("/nodes", pages.nodes_page)
    app.router.add_get("/nodes/{name}", node_page.node_page)
    app.router.add_get("/gpus", gpu_map.gpus_page)
    app.router.add_get("/usage", usage_page.usage_page)
    app.router.add_get("/mirror", mirror_page.mirror_page)
    app.router.add_get("/slurm", slurm_page.slurm_page)
    app.router.add_get("/login", signin.login_page)
    app.router.add_post("/login", signin.login)
    app.router.add_post("/logout", signin.logout)
    app.router.add_get("/login/oidc", oidc_signin.start)
    app.router.add_get("/login/oidc/callback", oidc_signin.callback)
    app.router.add_post("/act", act.act)
    app.router.add_get("/people", people_page.people_page)
    app.router.add_post("/made", made.made)
    app.router.add_get("/org", org_page.my_org)
    app.router.add_get("/org/{org}", org_page.org_page)
    app.router.add_static("/static", HERE / "static", append_version=False)
    return app


async def _to_console(_request: web.Request) -> web.Response:
    return see_other(PREFIX + "/")


def mount(app: web.Application, ctx: Console) -> None:
    """The console at /console on app (the client port's), /console itself leading to it."""
    app.router.add_get(PREFIX, _to_console)
    app.add_subapp(PREFIX, console_app(ctx))
