"""llmgw org create|show|delete|team|project|member|unmember and llmgw orgs: organizations,
their teams and projects, and who holds which role in them."""

from __future__ import annotations

from typing import cast

import click

from llmgw.api_types import (
    Deleted,
    MemberRemoved,
    MembershipView,
    NamedIn,
    OrgView,
    PersonRole,
    ProjectIn,
    ProjectView,
    RoleIn,
    ScopeView,
    TeamView,
)
from llmgw.cli import complete
from llmgw.cli.common import Settings, api_path, call, decoded, pass_settings
from llmgw.cli.output import (
    Listing,
    confirm,
    echo_json,
    echo_table,
    json_option,
    listing_options,
    when,
    yes_option,
)

ROLES = click.Choice(["admin", "manager", "member"])


@click.group()
def org() -> None:
    """Organizations, their teams and projects, and their members' roles."""


@org.command()
@click.argument("name")
@click.option("--title", default="", help="A title shown to people (the name is the handle).")
@json_option
@pass_settings
def create(settings: Settings, name: str, title: str, as_json: bool) -> None:
    """Make the organization NAME."""
    answer = call(settings, "POST", api_path("orgs"), NamedIn(name=name, title=title))
    if as_json:
        echo_json(answer)
        return
    click.echo(f"Organization {decoded(answer, OrgView).name} made.")


@click.command()
@listing_options
@pass_settings
def orgs(settings: Settings, out: Listing) -> None:
    """List the organizations.

    One line an organization: its name and title; -o wide adds when it was made.
    """
    answer = call(settings, "GET", api_path("orgs"))
    if out.raw(answer):
        return
    rows = [[o.name, o.title, when(o.created_at)] for o in decoded(answer, list[OrgView])]
    empty = "No organizations yet: `llmgw org create NAME`."
    out.table(["NAME", "TITLE", "CREATED"], rows, empty, shown=2)


@org.command()
@click.argument("name", shell_complete=complete.orgs)
@json_option
@pass_settings
def show(settings: Settings, name: str, as_json: bool) -> None:
    """Show the organization NAME: its teams, projects and members."""
    teams = call(settings, "GET", api_path("orgs", name, "teams"))
    projects = call(settings, "GET", api_path("orgs", name, "projects"))
    members = call(settings, "GET", api_path("orgs", name, "members"))
    if as_json:
        echo_json({"teams": teams, "projects": projects, "members": members})
        return
    rows = [[t.name, t.title] for t in decoded(teams, list[TeamView])]
    echo_table(["TEAM", "TITLE"], rows, "No teams.")
    click.echo()
    rows = [[p.name, p.team or "-", p.title] for p in decoded(projects, list[ProjectView])]
    echo_table(["PROJECT", "TEAM", "TITLE"], rows, "No projects.")
    click.echo()
    rows = [
        [m.user, _where(m.scope), m.role, m.set_by] for m in decoded(members, list[MembershipView])
    ]
    echo_table(["USER", "IN", "ROLE", "SET BY"], rows, "No members.")


def _where(scope: ScopeView) -> str:
    return scope.org if scope.kind == "org" else f"{scope.kind} {scope.name}"


@org.command()
@click.argument("name", shell_complete=complete.orgs)
@yes_option
@pass_settings
def delete(settings: Settings, name: str, yes: bool) -> None:
    """Delete the organization NAME with its teams, projects and memberships (it asks first,
    unless --yes)."""
    confirm(yes, f"Deleting organization {name} deletes its teams, projects and memberships")
    gone = decoded(call(settings, "DELETE", api_path("orgs", name)), Deleted)
    click.echo(f"Organization {gone.name} deleted.")


@org.command()
@click.argument("org_name", metavar="ORG", shell_complete=complete.orgs)
@click.argument("name")
@click.option("--delete", "remove", is_flag=True, help="Delete the team instead.")
@yes_option
@pass_settings
def team(settings: Settings, org_name: str, name: str, remove: bool, yes: bool) -> None:
    """Make the team NAME in ORG (or, with --delete, delete it with its memberships, limits
    and models: it asks first, unless --yes)."""
    if remove:
        confirm(yes, f"Deleting team {org_name}/{name} deletes its memberships and limits")
        answer = call(settings, "DELETE", api_path("orgs", org_name, "teams", name))
        click.echo(f"Team {org_name}/{decoded(answer, Deleted).name} deleted.")
        return
    answer = call(settings, "POST", api_path("orgs", org_name, "teams"), NamedIn(name=name))
    made = decoded(answer, TeamView)
    click.echo(f"Team {made.org}/{made.name} made.")


@org.command()
@click.argument("org_name", metavar="ORG", shell_complete=complete.orgs)
@click.argument("name")
@click.option("--team", "team_name", default="", help="The team the project is in.")
@click.option("--delete", "remove", is_flag=True, help="Delete the project instead.")
@yes_option
@pass_settings
def project(
    settings: Settings, org_name: str, name: str, team_name: str, remove: bool, yes: bool
) -> None:
    """Make the project NAME in ORG (or, with --delete, delete it with its memberships,
    limits and models: it asks first, unless --yes)."""
    if remove:
        confirm(yes, f"Deleting project {org_name}/{name} deletes its memberships and limits")
        answer = call(settings, "DELETE", api_path("orgs", org_name, "projects", name))
        click.echo(f"Project {org_name}/{decoded(answer, Deleted).name} deleted.")
        return
    body = ProjectIn(name=name, team=team_name)
    answer = call(settings, "POST", api_path("orgs", org_name, "projects"), body)
    made = decoded(answer, ProjectView)
    click.echo(f"Project {made.org}/{made.name} made.")


def _members_path(org_name: str, team_name: str, project_name: str, user: str) -> str:
    if team_name and project_name:
        raise click.UsageError("give --team or --project, not both")
    if team_name:
        return api_path("orgs", org_name, "teams", team_name, "members", user)
    if project_name:
        return api_path("orgs", org_name, "projects", project_name, "members", user)
    return api_path("orgs", org_name, "members", user)


scope_options = [
    click.option("--team", "team_name", default="", help="In this team of ORG."),
    click.option("--project", "project_name", default="", help="In this project of ORG."),
]


@org.command()
@click.argument("org_name", metavar="ORG", shell_complete=complete.orgs)
@click.argument("user")
@click.argument("role", type=ROLES)
@scope_options[0]
@scope_options[1]
@pass_settings
def member(
    settings: Settings, org_name: str, user: str, role: str, team_name: str, project_name: str
) -> None:
    """Give USER (a name or id) ROLE in ORG, or in one of its teams or projects; a role set
    here is never rewritten by a group rule."""
    path = _members_path(org_name, team_name, project_name, user)
    body = RoleIn(role=cast(PersonRole, role))  # ROLES: one of PersonRole's
    kept = decoded(call(settings, "PUT", path, body), MembershipView)
    click.echo(f"{user} is {kept.role} of {_where(kept.scope)}.")


@org.command()
@click.argument("org_name", metavar="ORG", shell_complete=complete.orgs)
@click.argument("user")
@scope_options[0]
@scope_options[1]
@pass_settings
def unmember(
    settings: Settings, org_name: str, user: str, team_name: str, project_name: str
) -> None:
    """Take USER's role in ORG (or in one of its teams or projects) away."""
    answer = call(settings, "DELETE", _members_path(org_name, team_name, project_name, user))
    decoded(answer, MemberRemoved)
    where = "/".join(n for n in (org_name, team_name or project_name) if n)
    click.echo(f"{user} left {where}.")
