"""llmgw user create|list|delete|staff: people made by staff, and the cluster's staff roles."""

from __future__ import annotations

import click

from llmgw.api_types import StaffView, UserDeleted, UserView
from llmgw.cli.common import Settings, api_path, call, decoded, pass_settings
from llmgw.cli.output import echo_json, echo_table, json_option, when


@click.group()
def user() -> None:
    """People (users) and their cluster staff roles."""


@user.command()
@click.argument("name")
@click.option("--email", default="", help="Their email address.")
@json_option
@pass_settings
def create(settings: Settings, name: str, email: str, as_json: bool) -> None:
    """Make the user NAME (people signed in through OIDC or provisioned by SCIM come later)."""
    answer = call(settings, "POST", api_path("users"), {"name": name, "email": email})
    if as_json:
        echo_json(answer)
        return
    made = decoded(answer, UserView)
    click.echo(f"User {made.name} made (id {made.id}).")


@user.command("list")
@json_option
@pass_settings
def list_(settings: Settings, as_json: bool) -> None:
    """List the users."""
    answer = call(settings, "GET", api_path("users"))
    if as_json:
        echo_json(answer)
        return
    rows = [
        [u.id, u.name, u.email, u.source, "active" if u.active else "inactive",
         when(u.created_at)]
        for u in decoded(answer, list[UserView])
    ]  # fmt: skip
    headers = ["ID", "NAME", "EMAIL", "SOURCE", "STATE", "CREATED"]
    echo_table(headers, rows, "No users yet: `llmgw user create NAME`.")


@user.command()
@click.argument("name")
@pass_settings
def delete(settings: Settings, name: str) -> None:
    """Delete the user NAME (a name or an id): their memberships, staff role, limits and
    keys go, and their keys are refused at once. A user from OIDC or SCIM comes back as a
    new user at their next sign-in or provisioning; to stop one, deactivate them instead
    (the identity provider's SCIM, or PATCH /api/v1/users/NAME {"active": false})."""
    gone = decoded(call(settings, "DELETE", api_path("users", name)), UserDeleted)
    click.echo(f"User {name} deleted (id {gone.user}); their keys are revoked.")


@user.command()
@click.argument("name")
@click.argument("role", type=click.Choice(["admin", "operator", "viewer", "none"]))
@pass_settings
def staff(settings: Settings, name: str, role: str) -> None:
    """Give the user NAME a cluster staff role: admin (everything), operator (models, nodes,
    mirror, Slurm), viewer (reads everything), or none."""
    body = {"role": None if role == "none" else role}
    now = decoded(call(settings, "PUT", api_path("users", name, "staff"), body), StaffView)
    click.echo(f"{name}: staff role {now.staff or 'none'}.")
