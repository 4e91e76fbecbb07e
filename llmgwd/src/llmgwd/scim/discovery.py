"""SCIM's discovery documents (RFC 7643 5-7): what this server supports, its resource types,
and the schemas of the attributes it keeps (no more: an attribute it would drop is not
listed)."""

from __future__ import annotations

from typing import Any

from llmgwd.scim.base import GROUP, USER, Doc

SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Schema"
RESOURCE_TYPE = "urn:ietf:params:scim:schemas:core:2.0:ResourceType"
CONFIG = "urn:ietf:params:scim:schemas:core:2.0:ServiceProviderConfig"
MAX_RESULTS = 200


def _attr(name: str, kind: str = "string", **kw: Any) -> Doc:
    """An attribute's definition, RFC 7643's defaults unless given."""
    doc: Doc = {
        "name": name,
        "type": kind,
        "multiValued": kw.get("multi", False),
        "description": kw.get("description", name),
        "required": kw.get("required", False),
        "caseExact": kw.get("case_exact", False),
        "mutability": kw.get("mutability", "readWrite"),
        "returned": kw.get("returned", "default"),
        "uniqueness": kw.get("uniqueness", "none"),
    }
    if "sub" in kw:
        doc["subAttributes"] = kw["sub"]
    if "refs" in kw:
        doc["referenceTypes"] = kw["refs"]
    return doc


USER_ATTRS = [
    _attr("userName", required=True, uniqueness="server"),
    _attr(
        "name",
        "complex",
        sub=[_attr("formatted"), _attr("familyName"), _attr("givenName")],
    ),
    _attr("displayName"),
    _attr(
        "emails",
        "complex",
        multi=True,
        sub=[_attr("value"), _attr("type"), _attr("primary", "boolean")],
    ),
    _attr("active", "boolean"),
]
GROUP_ATTRS = [
    _attr("displayName", required=True),
    _attr(
        "members",
        "complex",
        multi=True,
        sub=[
            _attr("value", mutability="immutable"),
            _attr("$ref", "reference", mutability="immutable", refs=["User"]),
            _attr("display", mutability="readOnly"),
        ],
    ),
]


def _meta(kind: str, location: str) -> Doc:
    return {"resourceType": kind, "location": location}


def schemas(base: str) -> list[Doc]:
    """The User and Group schemas."""
    return [
        {"schemas": [SCHEMA], "id": sid, "name": name, "description": name,
         "attributes": attrs, "meta": _meta("Schema", f"{base}/Schemas/{sid}")}
        for sid, name, attrs in ((USER, "User", USER_ATTRS), (GROUP, "Group", GROUP_ATTRS))
    ]  # fmt: skip


def resource_types(base: str) -> list[Doc]:
    """The User and Group resource types."""
    return [
        {"schemas": [RESOURCE_TYPE], "id": name, "name": name, "endpoint": f"/{name}s",
         "description": name, "schema": sid, "schemaExtensions": [],
         "meta": _meta("ResourceType", f"{base}/ResourceTypes/{name}")}
        for name, sid in (("User", USER), ("Group", GROUP))
    ]  # fmt: skip


def config(base: str) -> Doc:
    """What this server supports: PATCH and filters (eq), no bulk, sort, etag or password."""
    return {
        "schemas": [CONFIG],
        "documentationUri": "https://github.com/llmgw/llmgw",
        "patch": {"supported": True},
        "bulk": {"supported": False, "maxOperations": 0, "maxPayloadSize": 0},
        "filter": {"supported": True, "maxResults": MAX_RESULTS},
        "changePassword": {"supported": False},
        "sort": {"supported": False},
        "etag": {"supported": False},
        "authenticationSchemes": [
            {
                "type": "oauthbearertoken",
                "name": "Bearer token",
                "description": "the token `llmgw scim token` makes",
                "primary": True,
            }
        ],
        "meta": _meta("ServiceProviderConfig", f"{base}/ServiceProviderConfig"),
    }
