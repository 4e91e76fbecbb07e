"""/api/v1's one route table, each route with its rule, and the applications that serve it."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from llmgwd.api import (
    keys,
    level_limits,
    limits,
    mirror,
    models,
    nodes,
    openapi,
    people,
    person_keys,
    plans,
    servers,
    slurm,
    status,
    stored_tokens,
    tokens,
    usage,
)
from llmgwd.api.access import RouteHandler, guarded
from llmgwd.api.base import API_PREFIX, CTX, MAX_BODY_BYTES, ApiContext, errors_middleware
from llmgwd.auth import STAFF_ADMIN, STAFF_OPERATE, STAFF_READ, Rule, org_rule

Route = tuple[str, str, RouteHandler, Rule]  # method, path under API_PREFIX, handler, rule

# Staff viewers read everything and change nothing; operators change models, nodes (join
# tokens too), the mirror and Slurm; admins everything (keys, limits, prices, servers,
# people). The people routes' rules also name membership roles (api.people.TABLE).
READ, OPERATE, ADMIN = STAFF_READ, STAFF_OPERATE, STAFF_ADMIN

TABLE: list[Route] = [
    *[(m, path, people.plain(h), rule) for m, path, h, rule in people.TABLE],
    *person_keys.TABLE,
    *level_limits.TABLE,
    ("GET", "/status", status.get_status, READ),
    ("GET", "/openapi.json", openapi.get_openapi, READ),
    ("GET", "/models", models.list_models, READ),
    ("POST", "/models", models.add_model, OPERATE),
    ("GET", "/models/{name}", models.get_model, READ),
    ("DELETE", "/models/{name}", models.remove_model, OPERATE),
    ("POST", "/models/{name}/serve", models.serve_model, OPERATE),
    ("POST", "/models/{name}/stop", models.stop_model, OPERATE),
    ("POST", "/models/{name}/replicas", models.set_profile_replicas, OPERATE),
    ("PUT", "/models/{name}/context", models.set_context, OPERATE),
    ("GET", "/models/{name}/plan", plans.get_plan, READ),
    ("PUT", "/models/{name}/price", limits.set_price, ADMIN),
    ("GET", "/nodes", nodes.get_nodes, READ),
    ("POST", "/nodes/{name}/{action:cordon|drain|uncordon}", nodes.set_node_flags, OPERATE),
    ("DELETE", "/nodes/{name}", nodes.remove_node, OPERATE),
    ("POST", "/tokens", tokens.create_token, OPERATE),
    ("GET", "/keys", keys.list_keys, READ),
    ("POST", "/keys", keys.create_key, ADMIN),
    ("DELETE", "/keys/{key}", keys.revoke_key, ADMIN),
    ("PATCH", "/keys/{key}/limits", limits.set_key_limits, ADMIN),
    ("GET", "/usage", usage.get_usage, READ),
    ("GET", "/orgs/{org}/usage", usage.get_org_usage, org_rule("admin", read=True)),
    ("GET", "/mirror", mirror.get_mirror, READ),
    ("PUT", "/mirror/uploads/{sha256}", mirror.put_upload, OPERATE),
    ("POST", "/mirror/import", mirror.post_import, OPERATE),
    ("POST", "/mirror/sweep", mirror.post_sweep, OPERATE),
    ("GET", "/mirror/peers", mirror.get_peers, READ),
    ("POST", "/mirror/peers", mirror.post_peer, OPERATE),
    ("GET", "/slurm", slurm.get_slurm, READ),
    ("PUT", "/slurm", slurm.put_slurm, OPERATE),
    ("POST", "/slurm/nodes/{name}/{action:lend|reclaim}", slurm.lend, OPERATE),
    ("GET", "/servers", servers.list_servers, READ),
    ("POST", "/servers/tokens", servers.create_server_token, ADMIN),
    ("POST", "/servers/leave", servers.leave, ADMIN),
    # Not tokens or leave, the literal routes above (a name that would be refused at join).
    ("DELETE", "/servers/{name:(?!(?:tokens|leave)$)[^/]+}", servers.remove_server, ADMIN),
    ("POST", "/scim/token", stored_tokens.create_scim_token, ADMIN),
    ("POST", "/metrics/token", stored_tokens.create_metrics_token, ADMIN),
]


def api_routes() -> list[web.RouteDef]:
    """The table's routes, relative to API_PREFIX, each behind its rule's guard."""
    out = []
    for method, path, handler, rule in TABLE:
        route = guarded(rule, handler)
        out.append(web.get(path, route) if method == "GET" else web.route(method, path, route))
    return out


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
