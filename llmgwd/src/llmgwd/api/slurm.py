"""/api/v1's Slurm: `GET /slurm` shows Slurm's settings and where each node stands, `PUT
/slurm` changes the settings, `POST /slurm/nodes/{name}/lend|reclaim` lends a node or takes
it back."""

from __future__ import annotations

import logging

import msgspec
from aiohttp import web

from llmgw.api_types import SlurmView
from llmgw.errors import ApiError
from llmgwd.accounting.views import Invalid
from llmgwd.api.base import api_context, bad_field, caller, json_response, read_body
from llmgwd.slurm.settings import Busy, SettingsStore, SlurmSettings, SlurmSettingsIn

log = logging.getLogger(__name__)


def _settings(request: web.Request) -> SettingsStore:
    store = api_context(request).slurm
    if store is None:
        raise ApiError(503, "Slurm is not kept here", "server_error", "no_slurm")
    return store


def _view(request: web.Request, settings: SlurmSettings) -> SlurmView:
    """The API's view of the settings, with each node's standing if this llmgwd knows it."""
    known = api_context(request).slurm_status
    status = known() if known is not None else None
    return SlurmView(**msgspec.structs.asdict(settings), status=status)


async def get_slurm(request: web.Request) -> web.Response:
    """GET /slurm: Slurm's settings and each node's standing."""
    return json_response(_view(request, await _settings(request).get()))


async def put_slurm(request: web.Request) -> web.Response:
    """PUT /slurm: change the settings the body gives (the others stay); a 400 names the
    field at fault and changes nothing."""
    store = _settings(request)
    change = await read_body(request, SlurmSettingsIn)
    try:
        new = await store.change(change)
    except Invalid as e:
        raise bad_field(e.param, str(e)) from None
    except Busy as e:
        raise ApiError(409, str(e), "conflict_error", "busy") from None
    log.info("Slurm's settings changed by %s (enabled: %s)", caller(request), new.enabled)
    return json_response(_view(request, new))


async def lend(request: web.Request) -> web.Response:
    """POST /slurm/nodes/{name}/lend|reclaim: lend the node to Slurm (its replicas move away
    first) or take it back (cordoned in llmgw until its last job ends)."""
    store = _settings(request)
    name, action = request.match_info["name"], request.match_info["action"]
    try:
        new = await store.lend(name, action == "lend")
    except Invalid as e:
        raise ApiError(409, str(e), "invalid_request_error", "slurm_" + e.param) from None
    except Busy as e:
        raise ApiError(409, str(e), "conflict_error", "busy") from None
    log.info("node %s: %s to Slurm, by %s", name, action, caller(request))
    return json_response(_view(request, new))
