"""/api/v1's routes, and the applications that serve them."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from llmgwd.api import mirror, nodes, people, servers, slurm
from llmgwd.api.base import API_PREFIX, CTX, MAX_BODY_BYTES, ApiContext, errors_middleware
from llmgwd.api.keys import create_key, list_keys, revoke_key
from llmgwd.api.limits import set_key_limits, set_price
from llmgwd.api.models import (
    add_model,
    get_model,
    list_models,
    remove_model,
    serve_model,
    set_context,
    set_profile_replicas,
    stop_model,
)
from llmgwd.api.nodes import get_nodes, set_node_flags
from llmgwd.api.plans import get_plan
from llmgwd.api.status import get_status
from llmgwd.api.tokens import create_token
from llmgwd.api.usage import get_usage


def api_routes() -> list[web.RouteDef]:
    """The routes, relative to API_PREFIX."""
    return [
        *people.routes(),
        *slurm.routes(),
        *nodes.routes(),
        *mirror.routes(),
        *servers.routes(),
        web.get("/status", get_status),
        web.get("/nodes", get_nodes),
        web.get("/models", list_models),
        web.post("/models", add_model),
        web.get("/models/{name}", get_model),
        web.delete("/models/{name}", remove_model),
        web.post("/models/{name}/serve", serve_model),
        web.post("/models/{name}/stop", stop_model),
        web.post("/models/{name}/replicas", set_profile_replicas),
        web.put("/models/{name}/context", set_context),
        web.get("/models/{name}/plan", get_plan),
        web.post("/nodes/{name}/{action:cordon|drain|uncordon}", set_node_flags),
        web.get("/keys", list_keys),
        web.post("/keys", create_key),
        web.delete("/keys/{key}", revoke_key),
        web.patch("/keys/{key}/limits", set_key_limits),
        web.put("/models/{name}/price", set_price),
        web.get("/usage", get_usage),
        web.post("/tokens", create_token),
    ]


def api_subapp(ctx: ApiContext, auth: Middleware) -> web.Application:
    """The API to mount with parent.add_subapp(API_PREFIX, ...), guarded by auth."""
    app = web.Application(middlewares=[errors_middleware, auth], client_max_size=MAX_BODY_BYTES)
    app[CTX] = ctx
    app.add_routes(api_routes())
    return app


def api_app(ctx: ApiContext, auth: Middleware) -> web.Application:
    """A whole application serving the API under API_PREFIX (the Unix socket's)."""
    app = web.Application()
    app.add_subapp(API_PREFIX, api_subapp(ctx, auth))
    return app
