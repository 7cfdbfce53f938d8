"""Date partitions of a raw export: which days a scheduled run owns.

An export folder laid out Hive-style, one folder per day (``date=2026-11-03/``, also
``dt=`` or ``ds=``), is what data lakes and most export jobs produce. A scheduled or
backfill run of the DAG reads only the days of its data interval ``[start, end)``; a
manual run reads the whole folder. Each run's stage keys then cover exactly its days, so
a second run of the same interval (a rerun or a backfill over processed days) is a cache
hit in every stage.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from pathlib import Path

from core.stage import StageError

PARTITION_RE = re.compile(r"^(?:date|dt|ds)=(\d{4}-\d{2}-\d{2})$")


def date_partitions(root: str | Path) -> dict[date, str]:
    """The date partitions directly under ``root`` (day -> folder name); empty when
    ``root`` is a file or a folder without any."""
    root = Path(root)
    if not root.is_dir():
        return {}
    found: dict[date, str] = {}
    for child in sorted(root.iterdir()):
        m = PARTITION_RE.match(child.name)
        if m and child.is_dir():
            try:
                day = date.fromisoformat(m.group(1))
            except ValueError:  # date=2026-13-40: not a date; say so rather than skip it
                raise StageError(f"{child}: partition folder name is not a valid date") from None
            if day in found:
                raise StageError(f"{root}: two folders for {day}: {found[day]} and {child.name}")
            found[day] = child.name
    return found


def _instant(value: datetime | date | str) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def select(root: str | Path, start: datetime | date | str, end: datetime | date | str) -> list[str]:
    """Folder names of the partitions whose day starts in ``[start, end)``.

    A daily run for the interval 2026-11-03T00:00 to 2026-11-04T00:00 reads
    ``date=2026-11-03`` only. Raises when ``root`` has no date partitions at all (a path
    mistake, not an empty day)."""
    parts = date_partitions(root)
    if not parts:
        raise StageError(f"{root}: no date partitions (folders named date=YYYY-MM-DD) to select from")
    lo, hi = _instant(start), _instant(end)
    return [name for day, name in sorted(parts.items()) if lo <= _instant(day) < hi]


def for_interval(path: str | Path, start: datetime | date | str | None,
                 end: datetime | date | str | None) -> list[str] | None:
    """The partitions a run with the data interval ``[start, end)`` reads: ``None`` when
    ``path`` is not a partitioned folder or there is no interval (read the whole input),
    else the selected folder names (possibly none: a day with no export)."""
    if start is None or end is None or not date_partitions(path):
        return None
    return select(path, start, end)
