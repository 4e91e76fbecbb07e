"""SCIM's PATCH (RFC 7644 3.5.2) on a resource's document, without the store: add, replace and
remove, by a path (`attr`, `attr.sub`, `attr[value eq "x"]`) or none."""

from __future__ import annotations

import re
from typing import Any

from llmgwd.scim.base import PATCH_OP, Doc, fail, require_schema

MULTI = frozenset({"emails", "members"})  # the multi-valued attributes kept
MAX_PATH = 256  # characters of an operation's path
_FILTERED = re.compile(r'^(\w+)\[\s*value\s+eq\s+"([^"]*)"\s*\]$', re.IGNORECASE)


def canonical(name: str, names: list[str]) -> str:
    """An attribute's name as the schema spells it (SCIM names are case-insensitive); a name
    with the schema's URN in front loses it."""
    name = name.rsplit(":", 1)[-1] if name.lower().startswith("urn:") else name
    return next((n for n in names if n.lower() == name.lower()), name)


def apply(doc: Doc, body: Doc, names: list[str]) -> Doc:
    """doc after the PatchOp body's operations (a new dict; doc is not changed)."""
    require_schema(body, PATCH_OP, "a PATCH body")
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
        fail(400, f"op {op[:20]!r} is not add, replace or remove", "invalidSyntax")
    if path is None:
        if op == "remove" or not isinstance(value, dict):
            fail(400, "an operation without a path adds or replaces an object", "noTarget")
        for key, item in value.items():
            _set(doc, op, canonical(key, names), item)
        return
    if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH:
        fail(400, f"path: must be an attribute's name (at most {MAX_PATH})", "invalidPath")
    filtered = _FILTERED.match(path)
    if filtered:
        attr, wanted = canonical(filtered.group(1), names), filtered.group(2)
        if op != "remove" or attr not in MULTI:
            fail(400, "a filtered path is supported on remove of emails or members only",
                 "invalidPath")  # fmt: skip
        doc[attr] = [v for v in _items(doc, attr) if not _has_value(v, wanted)]
        return
    attr, _, sub = path.partition(".")
    attr = canonical(attr, names)
    if sub:
        if not isinstance(doc.get(attr) or {}, dict):
            fail(400, f"{attr[:40]}: has no sub-attributes", "invalidPath")
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
        old = _items(doc, attr)
        doc[attr] = old + [i for i in items if i not in old]
    else:
        doc[attr] = value


def _items(doc: Doc, attr: str) -> list[Any]:
    """A multi-valued attribute's values (a copy)."""
    items = doc.get(attr) or []
    if not isinstance(items, list):
        fail(400, f"{attr}: must be a list", "invalidValue")
    return list(items)


def _has_value(item: Any, wanted: str) -> bool:
    return isinstance(item, dict) and str(item.get("value")) == wanted
