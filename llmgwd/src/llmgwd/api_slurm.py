"""/api/v1's Slurm: `GET /slurm` shows Slurm's settings, `PUT /slurm` changes them."""

from __future__ import annotations

import logging

from aiohttp import web

from llmgwd.api import ApiError, _ctx, _who, bad_field, json_response, read_body
from llmgwd.meter_views import Invalid
from llmgwd.slurm.settings import SettingsStore, SlurmSettingsIn

log = logging.getLogger(__name__)


def _settings(request: web.Request) -> SettingsStore:
    store = _ctx(request).slurm
    if store is None:
        raise ApiError(503, "Slurm is not kept here", "server_error", "no_slurm")
    return store


async def get_slurm(request: web.Request) -> web.Response:
    """GET /slurm: Slurm's settings."""
    return json_response(await _settings(request).get())


async def put_slurm(request: web.Request) -> web.Response:
    """PUT /slurm: change the settings the body gives (the others stay); a 400 names the
    field at fault and changes nothing."""
    store = _settings(request)
    change = await read_body(request, SlurmSettingsIn)
    try:
        new = await store.change(change)
    except Invalid as e:
        raise bad_field(e.param, str(e)) from None
    log.info("Slurm's settings changed by %s (enabled: %s)", _who(request), new.enabled)
    return json_response(new)


def routes() -> list[web.RouteDef]:
    """This module's routes, relative to /api/v1."""
    return [web.get("/slurm", get_slurm), web.put("/slurm", put_slurm)]
