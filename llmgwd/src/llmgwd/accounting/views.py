"""What /api/v1 takes and shows for key limits, model prices and usage, and its checks."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from datetime import date
from typing import Literal, cast

import msgspec

from llmgw.api_types import MAX_MONEY, LimitsIn, PriceIn, UsageReport, UsageRow
from llmgwd.accounting.periods import day_id
from llmgwd.accounting.pricing import from_pico
from llmgwd.accounting.usage import Counts, Record
from llmgwd.catalog import KeyLimits

MAX_COUNT = 10**12  # requests, tokens: far above any real limit, below any overflow
GROUPS = ("key", "model", "day", "org", "team", "project", "user")
Group = Literal["key", "model", "day", "org", "team", "project", "user"]
LEVEL_GROUPS = ("org", "team", "project", "user")  # from the key's owner (Owner)


class Invalid(Exception):
    """A field the caller got wrong; the message is shown as it is."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def apply_limits(current: KeyLimits, body: LimitsIn) -> KeyLimits:
    """current with the fields body gives; Invalid names the first bad one."""
    changes: dict[str, object] = {}
    for name in body.__struct_fields__:
        value = getattr(body, name)
        if value is None:
            continue
        if name.endswith("_per"):
            pass  # a Period: msgspec checked it
        elif name == "budget_spend":
            _check_money(name, value)
        elif not 0 <= value <= MAX_COUNT:
            raise Invalid(name, f"must be between 0 (no limit) and {MAX_COUNT}")
        changes[name] = value
    return msgspec.structs.replace(current, **changes)


def check_price(body: PriceIn) -> None:
    """Prices are finite and not negative."""
    _check_money("prompt", body.prompt)
    _check_money("completion", body.completion)


def _check_money(param: str, value: float) -> None:
    if not (math.isfinite(value) and 0 <= value <= MAX_MONEY):
        raise Invalid(param, f"must be a number between 0 and {MAX_MONEY:.0f}")


def parse_day(param: str, text: str | None) -> str:
    """A YYYY-MM-DD date; none given: the first day of this month (UTC)."""
    if not text:
        return day_id(time.time())[:8] + "01"
    try:
        if len(text) == 10:
            return date.fromisoformat(text).isoformat()
    except ValueError:
        pass
    raise Invalid(param, "must be a date as YYYY-MM-DD")


def parse_group(param: str, text: str | None) -> Group:
    """One of GROUPS; key when none is given."""
    if not text:
        return "key"
    if text in GROUPS:
        return cast(Group, text)
    raise Invalid(param, f"must be one of {', '.join(GROUPS)}")


class Owner(msgspec.Struct, frozen=True, kw_only=True):
    """Whose a key's usage is: the level values a report groups by ("" none)."""

    org: str = ""
    team: str = ""  # ORG/TEAM
    project: str = ""  # ORG/PROJECT
    user: str = ""


NO_OWNER = Owner()


def report(
    records: Iterable[Record],
    by: Group,
    since: str,
    key_names: Mapping[str, str],
    owners: Mapping[str, Owner] | None = None,
) -> UsageReport:
    """Records summed by key, model, day or a level of the key's owner (owners, by key id),
    in that order of the group's value."""
    sums: dict[str, Counts] = {}
    total = Counts()
    for r in records:
        group = _group(r, by, owners or {})
        sums[group] = sums.get(group, Counts()).merge(r.counts)
        total = total.merge(r.counts)
    rows = []
    for group in sorted(sums):
        row = _row(sums[group])
        setattr(row, by, group)
        if by == "key":
            row.name = key_names.get(group, "")
        rows.append(row)
    return UsageReport(by=by, since=since, rows=rows, total=_row(total))


def _group(r: Record, by: Group, owners: Mapping[str, Owner]) -> str:
    if by == "key":
        return r.key_id
    if by == "model":
        return r.model
    if by == "day":
        return r.day
    return str(getattr(owners.get(r.key_id, NO_OWNER), by))


def _row(c: Counts) -> UsageRow:
    return UsageRow(
        requests=c.requests,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        total_tokens=c.prompt_tokens + c.completion_tokens,
        spend=from_pico(c.spend_pico),
    )
