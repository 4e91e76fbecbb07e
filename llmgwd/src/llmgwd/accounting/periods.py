"""Budget periods and usage days, in UTC: day ids (YYYY-MM-DD) and month ids (YYYY-MM)."""

from __future__ import annotations

import calendar
import time

from llmgwd.catalog import Period

DAY_S = 86400


def day_id(ts: float) -> str:
    """The UTC date of a unix time, as the usage keys name it."""
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def month_of(day: str) -> str:
    """The month id of a day id."""
    return day[:7]


def period_id(period: Period, day: str) -> str:
    """The id of the day's period: the day itself or its month."""
    return day if period == "day" else month_of(day)


def seconds_left(period: Period, ts: float) -> float:
    """Seconds from ts until the period holding it ends (UTC midnight or the 1st)."""
    t = time.gmtime(ts)
    end_of_day = (int(ts) // DAY_S + 1) * DAY_S
    if period == "day":
        return end_of_day - ts
    days_after = calendar.monthrange(t.tm_year, t.tm_mon)[1] - t.tm_mday
    return end_of_day + days_after * DAY_S - ts


class Today:
    """The current day id, worked out once a day rather than once a request."""

    __slots__ = ("_day", "_number")

    def __init__(self) -> None:
        self._number = -1
        self._day = ""

    def at(self, ts: float) -> str:
        """The day id of ts (ts near now: the cache holds one day)."""
        number = int(ts) // DAY_S
        if number != self._number:
            self._number, self._day = number, day_id(ts)
        return self._day
