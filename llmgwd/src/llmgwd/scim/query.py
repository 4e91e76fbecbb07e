"""SCIM's list queries (RFC 7644 3.4.2): the filter `ATTR eq "VALUE"`, paging by startIndex and
count, and attributes/excludedAttributes on what is answered."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from llmgwd.scim.base import LIST, SEARCH, Doc, fail, read_doc, require_schema
from llmgwd.scim.discovery import MAX_RESULTS
from llmgwd.scim.patch import canonical

_EQ = re.compile(r'^\s*([\w.:$-]+)\s+eq\s+("(?:[^"\\]|\\.)*"|true|false)\s*$', re.IGNORECASE)
ALWAYS = ("schemas", "id", "meta")  # answered whatever attributes asks
MAX_FILTER = 1024  # characters of a filter, in the URL or a .search body
MAX_PARAM = 1024  # characters of a .search body's other parameters (the URL's are bounded)
_ONLY = 'the filter supported is ATTRIBUTE eq "VALUE" (a JSON string) or eq true|false'


def matcher(text: str, names: list[str]) -> Callable[[Doc], bool]:
    """The filter's test of a document: `attr eq "value"` (userName case-insensitively)."""
    if len(text) > MAX_FILTER:
        fail(400, f"the filter is longer than {MAX_FILTER} characters", "invalidFilter")
    m = _EQ.match(text)
    if m is None:
        fail(400, _ONLY, "invalidFilter")
    attr = canonical(m.group(1), names)
    try:
        want: Any = json.loads(m.group(2).lower() if m.group(2)[0] != '"' else m.group(2))
    except ValueError:  # a bad escape (\q, \u12) or a control character
        fail(400, f"{_ONLY}: the value is not a JSON string", "invalidFilter")

    def test(doc: Doc) -> bool:
        got = doc.get(attr)
        if isinstance(got, str) and isinstance(want, str) and attr == "userName":
            return got.lower() == want.lower()
        return bool(got == want)

    return test


Params = Mapping[str, str]


async def params(request: web.Request) -> Params:
    """A list query's parameters: the URL's (GET), or a POST .../.search body's."""
    if request.method != "POST":
        return request.query
    body = await read_doc(request)
    require_schema(body, SEARCH, "a search")
    out = {}
    if body.get("filter") is not None:
        if not isinstance(body["filter"], str):
            fail(400, "filter: must be a string", "invalidFilter")
        out["filter"] = body["filter"]
    for key in ("startIndex", "count", "attributes", "excludedAttributes"):
        value = body.get(key)
        if value is not None:
            out[key] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            if len(out[key]) > MAX_PARAM:
                fail(400, f"{key}: at most {MAX_PARAM} characters", "invalidValue")
    return out


def _int(query: Params, name: str, default: int) -> int:
    try:
        return int(query.get(name, default))
    except ValueError:
        fail(400, f"{name}: must be an integer", "invalidValue")


def shaped(query: Params, doc: Doc, names: list[str]) -> Doc:
    """doc with only the attributes asked for (or without those excluded)."""
    picked = query.get("attributes")
    dropped = query.get("excludedAttributes")
    if picked:
        keep = {canonical(a.strip().split(".")[0], names) for a in picked.split(",")}
        return {k: v for k, v in doc.items() if k in keep or k in ALWAYS}
    if dropped:
        drop = {canonical(a.strip().split(".")[0], names) for a in dropped.split(",")}
        return {k: v for k, v in doc.items() if k not in drop or k in ALWAYS}
    return doc


def listed(query: Params, docs: list[Doc], names: list[str]) -> Doc:
    """A ListResponse of the documents the filter keeps, one page of them."""
    text = query.get("filter")
    if text:
        test = matcher(text, names)
        docs = [d for d in docs if test(d)]
    start = max(1, _int(query, "startIndex", 1))
    count = min(max(0, _int(query, "count", MAX_RESULTS)), MAX_RESULTS)
    page = docs[start - 1 : start - 1 + count]
    return {
        "schemas": [LIST],
        "totalResults": len(docs),
        "startIndex": start,
        "itemsPerPage": len(page),
        "Resources": [shaped(query, d, names) for d in page],
    }
