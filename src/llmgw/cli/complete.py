"""Shell completion of the names a cluster has (models, nodes, keys, organizations), asked of
/api/v1 as any command asks it; silent, with nothing offered, when that fails."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import CompletionItem

from llmgw import config
from llmgw.cli.common import Settings, api_path, call

# A shell waits on completion: a daemon that does not answer at once offers nothing.
TIMEOUT_S = 2.0


def _settings(ctx: click.Context) -> Settings:
    """The global options as given on the line being completed (the group's callback, which
    makes ctx.obj, does not run while completing)."""
    given = ctx.find_root().params
    kw: dict[str, Any] = {
        "socket": given.get("socket_path") or config.ServerConfig().socket,
        "agent_socket": given.get("agent_socket") or config.AgentConfig().socket,
        "timeout": TIMEOUT_S,
    }
    if "context" in {f.name for f in dataclasses.fields(Settings)}:  # --context, where it is
        kw["context"] = given.get("context_name")
    return Settings(**kw)


def _names(what: str, keep: Callable[[dict[str, Any]], bool]) -> Any:
    """A shell_complete callback offering the name of each item of GET /api/v1/WHAT kept."""

    def complete(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
        try:
            answer = call(_settings(ctx), "GET", api_path(what))
            names = [str(item["name"]) for item in answer if keep(item)]
        except Exception:  # completion is a courtesy: a failure offers nothing, says nothing
            return []
        return [CompletionItem(n) for n in sorted(set(names)) if n.startswith(incomplete)]

    return complete


def _any(_item: dict[str, Any]) -> bool:
    return True


models = _names("models", _any)
nodes = _names("nodes", _any)
orgs = _names("orgs", _any)
keys = _names("keys", lambda k: not k.get("revoked"))  # a revoked key's name names nothing
