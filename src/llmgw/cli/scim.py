"""llmgw scim token: the bearer token the identity provider provisions users and groups with."""

from __future__ import annotations

import click

from llmgw.api_types import ScimTokenView
from llmgw.cli.bearer import new_token
from llmgw.cli.common import Settings, pass_settings
from llmgw.cli.output import json_option


@click.group()
def scim() -> None:
    """SCIM 2.0 provisioning (/scim/v2 on the client port) by the site's identity provider."""


def _note(made: ScimTokenView) -> str:
    return (
        f"Give it to the identity provider with the URL https://HOST:PORT{made.path} "
        "(the client port); it is not shown again."
    )


@scim.command()
@json_option
@pass_settings
def token(settings: Settings, as_json: bool) -> None:
    """Make a new SCIM bearer token (shown once; the old one stops working)."""
    new_token(settings, as_json, "scim", ScimTokenView, _note)
