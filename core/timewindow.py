"""Daily time windows ("serve by day, train by night"): ``"22:00-06:00"`` is 22:00 to 06:00
the next morning, ``"01:00-05:00"`` the same night; an empty window means always. Times are
the host's local wall clock unless a ``datetime`` with a zone is given. Standard library only."""

from __future__ import annotations

import datetime as dt
import re

_RE = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


def parse(window: str) -> tuple[dt.time, dt.time] | None:
    """(start, end) of ``"HH:MM-HH:MM"``; None for an empty window; ValueError otherwise."""
    if not window:
        return None
    m = _RE.match(window.strip())
    if not m:
        raise ValueError(f"time window {window!r}: expected HH:MM-HH:MM (24-hour, e.g. 22:00-06:00)")
    start, end = dt.time(int(m[1]), int(m[2])), dt.time(int(m[3]), int(m[4]))
    if start == end:
        raise ValueError(f"time window {window!r}: start and end are equal; leave it empty for always")
    return start, end


def inside(window: str, now: dt.datetime) -> bool:
    bounds = parse(window)
    if bounds is None:
        return True
    start, end = bounds
    t = now.time()
    if start < end:
        return start <= t < end
    return t >= start or t < end  # across midnight


def next_start(window: str, now: dt.datetime) -> dt.datetime:
    """``now`` when inside the window, else the window's next opening."""
    bounds = parse(window)
    if bounds is None or inside(window, now):
        return now
    start = now.replace(hour=bounds[0].hour, minute=bounds[0].minute, second=0, microsecond=0)
    return start if start > now else start + dt.timedelta(days=1)
