"""/api/v1's one error body, and the checks of names, emails, titles and identity
provider ids its requests share."""

from __future__ import annotations

from typing import Annotated

import msgspec

# The checks a handler makes on a request's fields, said in the types so that the OpenAPI
# document states them (and msgspec refuses a body that breaks them, naming the field).
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
NAME_RULE = "must be 1-64 of a-z 0-9 . _ - and start with a letter or digit"
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, description=NAME_RULE)]
Email = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(|[^@\s]{1,64}@[^@\s]{1,255})$", description="must look like name@domain"
    ),
]
Title = Annotated[str, msgspec.Meta(max_length=200)]
ExternalId = Annotated[
    str,
    msgspec.Meta(
        max_length=256,
        pattern=r"^(|[^\s\x00-\x1f\x7f](.*[^\s\x00-\x1f\x7f])?)$",
        description="the person's id at the identity provider (SCIM's externalId): their "
        "first OIDC sign-in whose link claim (oidc.link_claim, by default sub) equals it is "
        "theirs; at most 256 printable characters, unpadded",
    ),
]


class ErrorBody(msgspec.Struct, omit_defaults=True):
    """The body of an error answer."""

    message: str
    type: str
    code: str
    param: str | None = None  # the request field at fault, for a 400


class ErrorAnswer(msgspec.Struct):
    """Every /api/v1 error answer: {"error": {"message", "type", "code", "param"?}}."""

    error: ErrorBody
