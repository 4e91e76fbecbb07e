"""llmgw user create|set|approve|delete|staff and llmgw users: people made by staff, accounts
waiting for approval, and the cluster's staff roles."""

from __future__ import annotations

from typing import cast

import click

from llmgw.api_types import (
    StaffIn,
    StaffRoleName,
    StaffView,
    UserChange,
    UserDeleted,
    UserIn,
    UserView,
)
from llmgw.cli.common import Settings, api_path, call, decoded, pass_settings
from llmgw.cli.output import (
    Listing,
    confirm,
    echo_json,
    json_option,
    listing_options,
    when,
    yes_option,
)


@click.group()
def user() -> None:
    """People (users) and their cluster staff roles."""


EXTERNAL_ID_HELP = (
    "Who they are at the identity provider (by default their OIDC subject: the ID token's "
    "sub, oidc.link_claim in llmgw.yaml(5)): their first `llmgw login` is this user."
)


@user.command()
@click.argument("name")
@click.option("--email", default="", help="Their email address.")
@click.option("--external-id", default="", help=EXTERNAL_ID_HELP)
@json_option
@pass_settings
def create(settings: Settings, name: str, email: str, external_id: str, as_json: bool) -> None:
    """Make the user NAME (people signed in through OIDC or provisioned by SCIM come later;
    with --external-id, their sign-in is this user)."""
    body = UserIn(name=name, email=email, external_id=external_id)
    answer = call(settings, "POST", api_path("users"), body)
    if as_json:
        echo_json(answer)
        return
    made = decoded(answer, UserView)
    click.echo(f"User {made.name} made (id {made.id}).")


@click.command()
@listing_options
@pass_settings
def users(settings: Settings, out: Listing) -> None:
    """List the users.

    One line a user: id, name, email, source, state (active, inactive, or waiting for
    staff's approval: `llmgw user approve NAME`) and when made; -o wide adds their external
    id.
    """
    answer = call(settings, "GET", api_path("users"))
    if out.raw(answer):
        return
    rows = [
        [u.id, u.name, u.email, u.source, _state(u), when(u.created_at), u.external_id or "-"]
        for u in decoded(answer, list[UserView])
    ]  # fmt: skip
    headers = ["ID", "NAME", "EMAIL", "SOURCE", "STATE", "CREATED", "EXTERNAL ID"]
    out.table(headers, rows, "No users yet: `llmgw user create NAME`.", shown=6)


def _state(u: UserView) -> str:
    if not u.active:
        return "inactive"
    return "active" if u.approved else "waiting"


@user.command()
@click.argument("name")
@pass_settings
def approve(settings: Settings, name: str) -> None:
    """Approve the account NAME (a name or an id), which waits since its first sign-in
    (oidc.approval_required in llmgw.yaml(5)): it signs in from then on and may make keys.
    `llmgw users` shows the accounts waiting."""
    now = decoded(call(settings, "POST", api_path("users", name, "approve")), UserView)
    click.echo(f"User {now.name} approved: they may sign in (`llmgw login`).")


@user.command("set")
@click.argument("name")
@click.option("--email", default=None, help="Their email address.")
@click.option("--external-id", default=None, help=EXTERNAL_ID_HELP + ' "" takes it away.')
@click.option("--active/--inactive", default=None, help="Deactivate (their keys stop at once).")
@pass_settings
def set_(
    settings: Settings,
    name: str,
    email: str | None,
    external_id: str | None,
    active: bool | None,
) -> None:
    """Change the user NAME (a name or an id): the options given change."""
    body = UserChange(email=email, external_id=external_id, active=active)  # None: kept
    if (email, external_id, active) == (None, None, None):
        raise click.UsageError("nothing to change: give --email, --external-id or --active")
    now = decoded(call(settings, "PATCH", api_path("users", name), body), UserView)
    state = "active" if now.active else "inactive"
    click.echo(f"User {now.name}: {now.email or 'no email'}, {state}, external id "
               f"{now.external_id or 'none'}.")  # fmt: skip


@user.command()
@click.argument("name")
@yes_option
@pass_settings
def delete(settings: Settings, name: str, yes: bool) -> None:
    """Delete the user NAME (a name or an id): their memberships, staff role, limits and
    keys go, and their keys are refused at once. A user from OIDC or SCIM comes back as a
    new user at their next sign-in or provisioning; to stop one, deactivate them instead
    (the identity provider's SCIM, or PATCH /api/v1/users/NAME {"active": false}).
    It asks first, unless --yes."""
    confirm(yes, f"Deleting user {name} deletes their memberships, staff role, limits and keys")
    gone = decoded(call(settings, "DELETE", api_path("users", name)), UserDeleted)
    click.echo(f"User {name} deleted (id {gone.user}); their keys are revoked.")


@user.command()
@click.argument("name")
@click.argument("role", type=click.Choice(["admin", "operator", "viewer", "none"]))
@pass_settings
def staff(settings: Settings, name: str, role: str) -> None:
    """Give the user NAME a cluster staff role: admin (everything), operator (models, nodes,
    mirror, Slurm), viewer (reads everything), or none."""
    body = StaffIn(role=None if role == "none" else cast(StaffRoleName, role))
    now = decoded(call(settings, "PUT", api_path("users", name, "staff"), body), StaffView)
    click.echo(f"{name}: staff role {now.staff or 'none'}.")
