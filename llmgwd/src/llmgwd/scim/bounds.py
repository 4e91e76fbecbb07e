"""What SCIM keeps of a User or Group, each attribute checked against its type and length bound
(400 invalidValue, naming the attribute and never echoing it) before anything is stored."""

from __future__ import annotations

from typing import Any

from llmgwd.scim.base import Doc, fail

MAX_NAME = 256  # displayName, name's parts, emails' type, members' display
MAX_EMAIL = 254  # an address (RFC 5321's path, less its brackets)
MAX_EMAILS = 10
MAX_EXTERNAL_ID = 256  # as the directory's (people.rules.MAX_EXTERNAL_ID)
MAX_MEMBER_ID = 64  # a user's id is 12: a longer one is no user
NAME_PARTS = ("formatted", "familyName", "givenName")  # as discovery.USER_ATTRS lists them


def text(where: str, value: Any, limit: int) -> str | None:
    """value if it is None or a string of at most limit characters; else 400 invalidValue."""
    if value is not None and (not isinstance(value, str) or len(value) > limit):
        fail(400, f"{where}: must be a string of at most {limit} characters", "invalidValue")
    return value


def _flag(where: str, value: Any) -> None:
    """A boolean, or the string "true" or "false" in any case (Entra sends "False")."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return
    if value is not None and not isinstance(value, bool):
        fail(400, f"{where}: must be true or false", "invalidValue")


def _name(value: Any) -> Doc | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        fail(400, f"name: must be an object of {', '.join(NAME_PARTS)}", "invalidValue")
    parts = {p: text(f"name.{p}", value.get(p), MAX_NAME) for p in NAME_PARTS}
    return {p: v for p, v in parts.items() if v is not None}


def _emails(value: Any) -> list[Doc] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_EMAILS:
        fail(400, f"emails: must be a list of at most {MAX_EMAILS}", "invalidValue")
    out = []
    for item in value:
        if not isinstance(item, dict):
            fail(400, "emails: each must be an object with a value", "invalidValue")
        _flag("emails.primary", item.get("primary"))
        email = {"value": text("emails.value", item.get("value"), MAX_EMAIL),
                 "type": text("emails.type", item.get("type"), MAX_NAME),
                 "primary": item.get("primary")}  # fmt: skip
        out.append({k: v for k, v in email.items() if v is not None})
    return out


def user(doc: Doc) -> Doc:
    """doc with its kept attributes checked (name and emails to the sub-attributes the schema
    lists); userName is the directory's to check."""
    _flag("active", doc.get("active"))
    text("displayName", doc.get("displayName"), MAX_NAME)
    text("externalId", doc.get("externalId"), MAX_EXTERNAL_ID)
    return doc | {"name": _name(doc.get("name")), "emails": _emails(doc.get("emails"))}


def group(doc: Doc) -> Doc:
    """doc with its attributes checked (displayName required)."""
    name = text("displayName", doc.get("displayName"), MAX_NAME)
    if not name or not name.strip():
        fail(400, "displayName: required", "invalidValue")
    text("externalId", doc.get("externalId"), MAX_EXTERNAL_ID)
    members = doc.get("members")
    if members is not None and not isinstance(members, list):
        fail(400, "members: must be a list", "invalidValue")
    for m in members or []:
        if not isinstance(m, dict):
            fail(400, "members: each must be an object with a value", "invalidValue")
        text("members.value", m.get("value"), MAX_MEMBER_ID)
        text("members.display", m.get("display"), MAX_NAME)
    return doc
