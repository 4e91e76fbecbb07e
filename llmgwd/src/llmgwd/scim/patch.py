"""SCIM's PATCH (RFC 7644 3.5.2) on a resource's document, without the store: add, replace and
remove, by a path (`attr`, `attr.sub`, `attr[value eq "x"]`) or none."""

from __future__ import annotations

import re
from typing import Any

from llmgwd.scim.base import PATCH_OP, Doc, fail

MULTI = frozenset({"emails", "members"})  # the multi-valued attributes kept
_FILTERED = re.compile(r'^(\w+)\[\s*value\s+eq\s+"([^"]*)"\s*\]$', re.IGNORECASE)


def canonical(name: str, names: list[str]) -> str:
    """An attribute's name as the schema spells it (SCIM names are case-insensitive); a name
    with the schema's URN in front loses it."""
    name = name.rsplit(":", 1)[-1] if name.lower().startswith("urn:") else name
    return next((n for n in names if n.lower() == name.lower()), name)


def apply(doc: Doc, body: Doc, names: list[str]) -> Doc:
    """doc after the PatchOp body's operations (a new dict; doc is not changed)."""
    if PATCH_OP not in body.get("schemas", []):
        fail(400, f"a PATCH body names the schema {PATCH_OP}", "invalidSyntax")
    ops = body.get("Operations")
    if not isinstance(ops, list) or not ops:
        fail(400, "a PATCH body has a list of Operations", "invalidSyntax")
    out = dict(doc)
    for op in ops:
        if not isinstance(op, dict):
            fail(400, "each operation is an object", "invalidSyntax")
        _one(out, str(op.get("op", "")).lower(), op.get("path"), op.get("value"), names)
    return out


def _one(doc: Doc, op: str, path: Any, value: Any, names: list[str]) -> None:
    if op not in ("add", "replace", "remove"):
        fail(400, f"op {op!r} is not add, replace or remove", "invalidSyntax")
    if path is None:
        if op == "remove" or not isinstance(value, dict):
            fail(400, "an operation without a path adds or replaces an object", "noTarget")
        for key, item in value.items():
            _set(doc, op, canonical(key, names), item)
        return
    if not isinstance(path, str) or not path:
        fail(400, "path: must be an attribute's name", "invalidPath")
    filtered = _FILTERED.match(path)
    if filtered:
        if op != "remove":
            fail(400, "a filtered path is supported on remove only", "invalidPath")
        attr, wanted = canonical(filtered.group(1), names), filtered.group(2)
        doc[attr] = [v for v in doc.get(attr, []) if not _has_value(v, wanted)]
        return
    attr, _, sub = path.partition(".")
    attr = canonical(attr, names)
    if sub:
        inner = dict(doc.get(attr) or {})
        _set(inner, op, sub, value)
        doc[attr] = inner
    elif op == "remove":
        doc.pop(attr, None)
    else:
        _set(doc, op, attr, value)


def _set(doc: Doc, op: str, attr: str, value: Any) -> None:
    if op == "remove":
        doc.pop(attr, None)
    elif op == "add" and attr in MULTI:
        items = value if isinstance(value, list) else [value]
        old = list(doc.get(attr) or [])
        doc[attr] = old + [i for i in items if i not in old]
    else:
        doc[attr] = value


def _has_value(item: Any, wanted: str) -> bool:
    return isinstance(item, dict) and str(item.get("value")) == wanted
