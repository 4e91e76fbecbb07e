"""/api/v1's one route table: a record per route (api.route.Route) with its rule, request and
answer types and status, and the applications that serve it, each route behind its guard."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from llmgw.api_types import (
    BackupBundle,
    ContextIn,
    ImportIn,
    ImportOut,
    KeyIn,
    KeyView,
    LimitsIn,
    MaxTokensIn,
    MetricsTokenView,
    MirrorStatus,
    ModelIn,
    ModelRemoved,
    ModelView,
    NewKey,
    NodeFlagsView,
    NodeRemoved,
    NodeView,
    PeerIn,
    PeerView,
    PlaneRemoved,
    PlaneTokenIn,
    PlaneView,
    PlanView,
    PriceIn,
    ProfileReplicasIn,
    ProviderIn,
    ProviderRemoved,
    ProviderView,
    RemoveIn,
    ScimTokenView,
    ServeIn,
    SlurmSettingsIn,
    SlurmView,
    StagedPackage,
    StatusView,
    SweepIn,
    SweepOut,
    TokenView,
    UpgradeRoll,
    UpgradeStartIn,
    UpgradeView,
    UploadView,
    UsageReport,
)
from llmgwd.api import (
    backup,
    keys,
    level_limits,
    limits,
    mirror,
    models,
    nodes,
    openapi,
    people,
    person_keys,
    planes,
    plans,
    providers,
    slurm,
    status,
    stored_tokens,
    tokens,
    upgrade,
    usage,
)
from llmgwd.api.access import guarded
from llmgwd.api.base import API_PREFIX, CTX, MAX_BODY_BYTES, ApiContext, errors_middleware
from llmgwd.api.route import ROUTES, Route, old_paths
from llmgwd.auth import STAFF_ADMIN, STAFF_OPERATE, STAFF_READ, org_rule

# Staff viewers read everything and change nothing; operators change models, nodes (join
# tokens too), the mirror and Slurm; admins everything (keys, limits, prices, control
# planes, people). The people routes' rules also name membership roles (api.people.TABLE).
READ, OPERATE, ADMIN = STAFF_READ, STAFF_OPERATE, STAFF_ADMIN
CREATED = 201

# Path parameters the handlers check, as the document states them.
_NODE = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"}
NODE = {"name": _NODE}
SHA256 = {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}
PLANE = {"name": _NODE | {"not": {"enum": ["tokens", "leave"]}}}

PLANES: list[Route] = [
    Route("GET", "/planes", planes.list_planes, READ, answer=list[PlaneView]),
    Route("POST", "/planes/tokens", planes.create_plane_token, ADMIN, PlaneTokenIn, TokenView),
    Route("POST", "/planes/leave", planes.leave, ADMIN, RemoveIn, PlaneRemoved),
    # Not tokens or leave, the literal routes above (a name that would be refused at join):
    # DELETE there is their 405.
    Route(
        "DELETE",
        "/planes/{name:(?!(?:tokens|leave)$)[^/]+}",
        planes.remove_plane,
        ADMIN,
        RemoveIn,
        PlaneRemoved,
        params=PLANE,
        errors=("405",),
    ),
]

TABLE: list[Route] = [
    *people.TABLE,
    *person_keys.TABLE,
    *level_limits.TABLE,
    Route("GET", "/status", status.get_status, READ, answer=StatusView),
    # this document (a JSON object)
    Route("GET", "/openapi.json", openapi.get_openapi, READ, answer=dict[str, Any]),
    Route("GET", "/models", models.list_models, READ, answer=list[ModelView]),
    Route("POST", "/models", models.add_model, OPERATE, ModelIn, ModelView, CREATED),
    # where a model not yet added would go (nothing stored or fetched), to READ as GET plan
    Route("POST", "/models/plan", plans.preview_plan, READ, ModelIn, PlanView),
    Route("GET", "/models/{name}", models.get_model, READ, answer=ModelView),
    Route("DELETE", "/models/{name}", models.remove_model, OPERATE, answer=ModelRemoved),
    Route("POST", "/models/{name}/serve", models.serve_model, OPERATE, ServeIn, ModelView),
    Route("POST", "/models/{name}/stop", models.stop_model, OPERATE, answer=ModelView),
    Route(
        "POST",
        "/models/{name}/replicas",
        models.set_profile_replicas,
        OPERATE,
        ProfileReplicasIn,
        ModelView,
    ),
    Route("PUT", "/models/{name}/context", models.set_context, OPERATE, ContextIn, ModelView),
    Route(
        "PUT", "/models/{name}/max_tokens", models.set_max_tokens, OPERATE, MaxTokensIn, ModelView
    ),
    Route("POST", "/models/{name}/restart", models.restart_model, OPERATE, answer=ModelView),
    Route("GET", "/models/{name}/plan", plans.get_plan, READ, answer=PlanView),
    Route("PUT", "/models/{name}/price", limits.set_price, ADMIN, PriceIn, ModelView),
    # External providers: a credential that spends the site's money, so staff admins only.
    Route("GET", "/providers", providers.list_providers, READ, answer=list[ProviderView]),
    Route("POST", "/providers", providers.add_provider, ADMIN, ProviderIn, ProviderView, CREATED),
    Route("DELETE", "/providers/{name}", providers.remove_provider, ADMIN, answer=ProviderRemoved),
    Route("GET", "/nodes", nodes.get_nodes, READ, answer=list[NodeView]),
    Route(
        "POST",
        "/nodes/{name}/{action:cordon|drain|uncordon}",
        nodes.set_node_flags,
        OPERATE,
        answer=NodeFlagsView,
        params=NODE,
    ),
    Route("DELETE", "/nodes/{name}", nodes.remove_node, OPERATE, answer=NodeRemoved, params=NODE),
    Route("POST", "/tokens", tokens.create_token, OPERATE, answer=TokenView, status=CREATED),
    Route("GET", "/keys", keys.list_keys, READ, answer=list[KeyView]),
    Route("POST", "/keys", keys.create_key, ADMIN, KeyIn, NewKey, CREATED),
    Route("DELETE", "/keys/{key}", keys.revoke_key, ADMIN, answer=KeyView),
    Route("PATCH", "/keys/{key}/limits", limits.set_key_limits, ADMIN, LimitsIn, KeyView),
    Route("GET", "/usage", usage.get_usage, READ, answer=UsageReport),
    Route(
        "GET",
        "/orgs/{org}/usage",
        usage.get_org_usage,
        org_rule("admin", read=True),
        answer=UsageReport,
    ),
    Route("GET", "/mirror", mirror.get_mirror, READ, answer=MirrorStatus),
    # the body: the file's bytes
    Route(
        "PUT",
        "/mirror/uploads/{sha256}",
        mirror.put_upload,
        OPERATE,
        answer=UploadView,
        status=CREATED,
        params=SHA256,
    ),
    Route("POST", "/mirror/import", mirror.post_import, OPERATE, ImportIn, ImportOut, CREATED),
    Route("POST", "/mirror/sweep", mirror.post_sweep, OPERATE, SweepIn, SweepOut),
    Route("GET", "/mirror/peers", mirror.get_peers, READ, answer=list[PeerView]),
    Route("POST", "/mirror/peers", mirror.post_peer, OPERATE, PeerIn, PeerView, CREATED),
    Route("GET", "/slurm", slurm.get_slurm, READ, answer=SlurmView),
    Route("PUT", "/slurm", slurm.put_slurm, OPERATE, SlurmSettingsIn, SlurmView),
    Route(
        "POST",
        "/slurm/nodes/{name}/{action:lend|reclaim}",
        slurm.lend,
        OPERATE,
        answer=SlurmView,
        params=NODE,
    ),
    *PLANES,
    # the whole state, CA and secret included, for `llmgw backup` to seal
    Route("POST", "/backup", backup.make_backup, ADMIN, answer=BackupBundle, errors=("409",)),
    # llmgw upgrade: a package's bytes (the body) kept and recorded; the roll
    Route("GET", "/upgrade", upgrade.get_upgrade, READ, answer=UpgradeView),
    Route(
        "PUT",
        "/upgrade/packages/{sha256}",
        upgrade.put_package,
        ADMIN,
        answer=StagedPackage,
        status=CREATED,
        params=SHA256,
        errors=("411", "507"),  # no Content-Length (or an empty file); no room for it
    ),
    Route("POST", "/upgrade/start", upgrade.start, ADMIN, UpgradeStartIn, UpgradeRoll),
    Route("POST", "/upgrade/{action:resume|abort}", upgrade.act, ADMIN, answer=UpgradeRoll),
    # /planes under its old word, deprecated, for the llmgw commands that still call it.
    *old_paths(PLANES, "/planes", "/servers"),
    Route(
        "POST",
        "/scim/token",
        stored_tokens.create_scim_token,
        ADMIN,
        answer=ScimTokenView,
        status=CREATED,
    ),
    Route(
        "POST",
        "/metrics/token",
        stored_tokens.create_metrics_token,
        ADMIN,
        answer=MetricsTokenView,
        status=CREATED,
    ),
]


def api_routes() -> list[web.RouteDef]:
    """The table's routes, relative to API_PREFIX, each behind its rule's guard."""
    out = []
    for r in TABLE:
        run = guarded(r.rule, r.handler)
        out.append(web.get(r.path, run) if r.method == "GET" else web.route(r.method, r.path, run))
    return out


def api_subapp(ctx: ApiContext, auth: Middleware) -> web.Application:
    """The API to mount with parent.add_subapp(API_PREFIX, ...), guarded by auth."""
    app = web.Application(middlewares=[errors_middleware, auth], client_max_size=MAX_BODY_BYTES)
    app[CTX] = ctx
    app[ROUTES] = TABLE
    app.add_routes(api_routes())
    return app


def api_app(ctx: ApiContext, auth: Middleware) -> web.Application:
    """A whole application serving the API under API_PREFIX (the Unix socket's)."""
    app = web.Application()
    app.add_subapp(API_PREFIX, api_subapp(ctx, auth))
    return app
