"""Date partitions: which days a scheduled run reads, the builder's daily layout, and the
clean stage reading only the selected days with a key of its own."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core import partitions
from core.config import load_config
from core.stage import StageError
from demo import builder as rawdata
from jobs.spark import clean, common


def _layout(root: Path, names: list[str]) -> Path:
    for n in names:
        (root / n).mkdir(parents=True)
    return root


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        ("2026-11-02T00:00:00+00:00", "2026-11-03T00:00:00+00:00", ["date=2026-11-02"]),  # a daily run
        ("2026-11-02T00:00:00Z", "2026-11-09T00:00:00Z", ["date=2026-11-02", "dt=2026-11-03"]),  # weekly
        (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC), ["date=2026-11-01"]),
        ("2026-11-01T12:00:00+00:00", "2026-11-02T12:00:00+00:00", ["date=2026-11-02"]),  # day starts inside
        ("2026-12-03T00:00:00+00:00", "2026-12-04T00:00:00+00:00", []),  # no export that day
    ],
)
def test_select_takes_the_days_that_start_in_the_interval(tmp_path, start, end, expected):
    root = _layout(tmp_path, ["date=2026-11-01", "date=2026-11-02", "dt=2026-11-03", "notes", "date=latest"])
    assert partitions.select(root, start, end) == expected


def test_unpartitioned_input_or_no_interval_reads_everything(tmp_path):
    f = tmp_path / "raw.csv"
    f.write_text("a\n")
    assert partitions.for_interval(f, "2026-11-01", "2026-11-02") is None
    assert partitions.for_interval(_layout(tmp_path / "flat", ["x", "y"]), "2026-11-01", "2026-11-02") is None
    parted = _layout(tmp_path / "p", ["date=2026-11-01"])
    assert partitions.for_interval(parted, None, None) is None
    assert partitions.for_interval(parted, "2026-11-05", "2026-11-06") == []


def test_bad_partition_layouts_fail_with_the_folder_named(tmp_path):
    with pytest.raises(StageError, match="not a valid date"):
        partitions.date_partitions(_layout(tmp_path / "a", ["date=2026-13-40"]))
    with pytest.raises(StageError, match="two folders for 2026-11-01"):
        partitions.date_partitions(_layout(tmp_path / "b", ["date=2026-11-01", "dt=2026-11-01"]))
    with pytest.raises(StageError, match="no date partitions"):
        partitions.select(_layout(tmp_path / "c", ["x"]), "2026-11-01", "2026-11-02")


def test_builder_daily_layout_holds_every_row_once(tmp_path):
    s = rawdata.build_raw(tmp_path, rawdata.BuilderConfig(rows=600, seed=4, fmt="jsonl"), daily=True)
    lines = (tmp_path / "raw.jsonl").read_text().splitlines()
    parts = sorted((tmp_path / "daily").glob("date=*/raw.jsonl"))
    part_lines = [ln for p in parts for ln in p.read_text().splitlines()]
    assert len(part_lines) == len(lines)

    def whole(ls: list[str]) -> list[str]:  # malformed rows are truncated at random points
        out = []
        for ln in ls:
            try:
                json.loads(ln)
            except ValueError:
                continue
            out.append(ln)
        return sorted(out)

    assert whole(part_lines) == whole(lines) and len(whole(lines)) < len(lines)
    assert sum(s["_daily"].values()) == 600 == len(lines)
    assert [p.parent.name for p in parts] == [f"date={d}" for d in sorted(s["_daily"])]


def test_clean_reads_only_the_selected_days_with_its_own_key(tmp_path, spark, lake):
    raw = tmp_path / "raw"
    rawdata.build_raw(raw, rawdata.BuilderConfig(rows=800, seed=9), daily=True)
    daily = raw / "daily"
    base = {"lake_root": str(lake), "input.path": str(daily)}
    days = partitions.select(daily, "2026-11-02", "2026-11-04")
    assert days == ["date=2026-11-02", "date=2026-11-03"]

    one = clean.run(load_config(overrides={**base, "input.partitions": days}), run_id="r1", spark=spark)
    expected = sum(sum(1 for _ in (daily / d / "raw.csv").open()) - 1 for d in days)
    stats = one.manifest["stats"]
    assert stats["rows_in"] == expected == stats["kept"] + stats["quarantined"] + stats["unlabeled"]
    assert set(one.manifest["inputs"]["raw"]["partitions"]) == set(days)

    again = clean.run(load_config(overrides={**base, "input.partitions": days}), run_id="r2", spark=spark)
    assert again.cache_hit and again.path == one.path
    other = clean.run(load_config(overrides={**base, "input.partitions": ["date=2026-11-04"]}),
                      run_id="r3", spark=spark)
    assert not other.cache_hit and other.path != one.path
    whole = clean.run(load_config(overrides=base), run_id="r4", spark=spark)
    assert whole.manifest["stats"]["rows_in"] == 800

    with pytest.raises(StageError, match="partition\\(s\\) not found: date=2026-12-01"):
        common.input_sources(load_config(overrides={**base, "input.partitions": ["date=2026-12-01"]}))
