"""Writing the raw export: ``raw.<csv|jsonl|parquet>`` with its malformed records, the
same rows partitioned by day (``daily/date=YYYY-MM-DD/``), and the file checksum the
ground-truth summary records.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any

from demo.common import COLUMNS, EPOCH, _py_rng


def _malformed_line(tid: str, ts: str, channel: str, msg: str, intent: str,
                    rng: random.Random) -> str:
    # An unclosed quote: a line-based CSV reader sees fewer fields than the header.
    msg = msg.replace('"', "")
    if rng.random() < 0.5:
        return f'{tid},{ts},"{channel},{msg}'
    return f'{tid},{ts},{channel},"{msg},{intent},[{{'


def _write_raw(path: Path, fmt: str, cols: dict[str, list[Any]], defect: list[str | None],
               rng: random.Random) -> None:
    n = len(cols["ticket_id"])
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({c: pa.array(cols[c], type=pa.string()) for c in COLUMNS})
        pq.write_table(table, path)
        return
    with path.open("w", encoding="utf-8", newline="") as fh:
        if fmt == "csv":
            w = csv.writer(fh, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
            w.writerow(COLUMNS)
            for i in range(n):
                rec = [cols[c][i] for c in COLUMNS]
                if defect[i] == "malformed_record":
                    fh.write(_malformed_line(*rec[:5], rng) + "\n")
                else:
                    w.writerow(rec)
        else:
            for i in range(n):
                line = json.dumps({c: cols[c][i] for c in COLUMNS}, ensure_ascii=False)
                if defect[i] == "malformed_record":
                    line = line[: rng.randint(10, len(line) - 2)]  # a truncated object
                fh.write(line + "\n")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_daily(out: Path, fmt: str, cols: dict[str, list[Any]], defect: list[str | None],
                 seed: int) -> dict[str, int]:
    """The same rows again as a date-partitioned export, ``out/date=YYYY-MM-DD/raw.<fmt>``,
    the layout a scheduled run reads one day of. A row goes to its ``created_at`` day; a
    row whose timestamp is broken (a planted defect) goes to the day of the row before
    it, as an export job partitioning by ingestion time would put it."""
    days: list[str] = []
    for ts in cols["created_at"]:
        ok = isinstance(ts, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}T.*", ts or "")
        days.append(ts[:10] if ok else (days[-1] if days else EPOCH.astype(str)[:10]))
    counts: dict[str, int] = {}
    for day in sorted(set(days)):
        idx = [i for i, d in enumerate(days) if d == day]
        part = out / f"date={day}"
        part.mkdir(parents=True, exist_ok=True)
        _write_raw(part / f"raw.{fmt}", fmt, {c: [cols[c][i] for i in idx] for c in COLUMNS},
                   [defect[i] for i in idx], _py_rng(seed, f"daily-{day}"))
        counts[day] = len(idx)
    return counts
