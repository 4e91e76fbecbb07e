"""The llmgw command's entry point: global options and the command tree."""

from __future__ import annotations

import copy

import click

from llmgw import config
from llmgw.cli import (
    backup,
    context,
    key,
    level_limits,
    login,
    metrics,
    mirror,
    model,
    node,
    org,
    plane,
    plane_join,
    plane_migrate,
    planes,
    provider,
    scim,
    slurm,
    upgrade,
    usage,
    user,
    version,
)
from llmgw.cli.common import Settings


@click.group("llmgw", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--socket",
    "socket_path",
    envvar="LLMGW_SOCKET",
    metavar="PATH",
    default=config.ServerConfig().socket,
    show_default=True,
    help="llmgwd's Unix socket (env LLMGW_SOCKET).",
)
@click.option(
    "--agent-socket",
    envvar="LLMGW_AGENT_SOCKET",
    metavar="PATH",
    default=config.AgentConfig().socket,
    show_default=True,
    help="llmgw-agentd's Unix socket (env LLMGW_AGENT_SOCKET).",
)
@click.option(
    "--context",
    "context_name",
    envvar="LLMGW_CONTEXT",
    metavar="NAME",
    help="The control plane to talk to over HTTPS (env LLMGW_CONTEXT; see llmgw context).",
)
@click.version_option(package_name="llmgw")
@click.pass_context
def main(ctx: click.Context, socket_path: str, agent_socket: str, context_name: str | None) -> None:
    """llmgw: run an on-premise, OpenAI-compatible LLM cluster.

    Commands talk to the local llmgwd (or llmgw-agentd) over its Unix socket, which
    needs root or the llmgw group, or, with a context (`llmgw context`), to a control
    plane's /api/v1 over HTTPS with a key or the `llmgw login` session. Exit status: 0
    done, 1 the daemon refused (its reason on stderr), 2 usage error, 3 the daemon cannot
    be reached (or its certificate is not from the CA pinned for it), 4 no such model or key;
    with --wait, 5 the --timeout ran out, 6 a replica failed.
    """
    ctx.obj = Settings(socket=socket_path, agent_socket=agent_socket, context=context_name)


def old_name(command: click.Command, name: str) -> click.Command:
    """command under the name it had before, which still works but is listed nowhere (not in
    --help, completion or llmgw(1)): the same command, its subcommands shared."""
    alias = copy.copy(command)
    alias.name, alias.hidden = name, True
    return alias


main.add_command(plane.plane)
main.add_command(plane.status)
main.add_command(planes.planes)
for _command in (planes.token, planes.leave, planes.remove, plane_join.join,
                 plane_migrate.migrate):  # fmt: skip
    plane.plane.add_command(_command)
# The old words (a control plane was a "server"), so that scripts written with them still work.
main.add_command(old_name(plane.plane, "server"))
main.add_command(old_name(planes.planes, "servers"))
main.add_command(node.node)
main.add_command(model.model)
main.add_command(provider.provider)
main.add_command(key.key)
main.add_command(level_limits.limits)
main.add_command(org.org)
main.add_command(user.user)
main.add_command(login.login)
main.add_command(login.logout)
main.add_command(context.context)
main.add_command(usage.usage)
main.add_command(mirror.mirror)
main.add_command(slurm.slurm)
main.add_command(scim.scim)
main.add_command(metrics.metrics)
main.add_command(version.version)
main.add_command(backup.backup)
main.add_command(backup.restore)
main.add_command(upgrade.upgrade)
# One listing word a resource (`llmgw keys` as `llmgw models`); the `list` subcommands that
# came before still work, listed nowhere.
for _group, _listing in ((key.key, key.keys), (user.user, user.users), (org.org, org.orgs),
                         (model.model, model.models), (node.node, node.nodes),
                         (provider.provider, provider.providers)):  # fmt: skip
    main.add_command(_listing)
    _group.add_command(old_name(_listing, "list"))
