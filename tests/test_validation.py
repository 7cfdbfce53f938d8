"""The Great Expectations gate: passes good data, names every failure with counts, and
never writes a data value into its result, its Data Docs or its exception."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest

from pii import detector as pii
from quality import validation
from quality.validation import GateFailed, GateThresholds

LABELS = ["card_arrival", "lost_or_stolen_card", "top_up_failed"]
SECRET = "zelda.quintero@example.org"


def frame(n: int = 200) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "record_id": [f"r{i:05d}" for i in range(n)],
            "text": [f"message number {i} about my card <CARD> and <EMAIL>" for i in range(n)],
            "label": [LABELS[i % 3] for i in range(n)],
            "created_at": [dt.datetime(2026, 11, 1) + dt.timedelta(minutes=i) for i in range(n)],
        }
    )


def write(df: pd.DataFrame, d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    df.to_parquet(d / "part-0.parquet", index=False)
    return d


def run(df: pd.DataFrame, tmp: Path, accounting=None, **th):
    data = write(df, tmp / "data")
    acc = accounting or {"rows_in": len(df) + 10, "kept": len(df), "quarantined": 4, "merged": 6}
    return validation.validate(
        data,
        tmp / "out",
        labels=LABELS,
        accounting=acc,
        residual_patterns=pii.RESIDUAL_PATTERNS,
        thresholds=GateThresholds(**th),
    )


def all_output_text(out: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())


def test_good_data_passes_with_data_docs(tmp_path: Path) -> None:
    s = run(frame(), tmp_path)
    assert s["success"], s["failures"]
    validation.check(s)  # does not raise
    assert (tmp_path / "out" / "data_docs" / "index.html").exists()
    assert (tmp_path / "out" / validation.RESULT_FILE).exists()
    checks = {e["check"] for e in s["expectations"]}
    assert {
        "schema",
        "row_count",
        "not_null.text",
        "not_null.label",
        "label_set",
        "length",
        "duplicate_rate",
        "accounting",
    } <= checks
    assert {f"residual_pii.{k}" for k in pii.RESIDUAL_PATTERNS} <= checks


def test_each_failure_is_named_with_counts_and_no_values(tmp_path: Path) -> None:
    df = frame()
    df.loc[0, "text"] = f"please write to {SECRET} today"  # residual e-mail
    df.loc[1, "text"] = "call +44 20 7946 0958 asap"  # residual phone
    df.loc[2, "label"] = None  # null label
    df.loc[3, "label"] = "secret_label_value"  # outside the set
    df.loc[4, "text"] = "x"  # too short
    df.loc[10:19, "text"] = "the same duplicated sentence"  # 10 duplicates
    acc = {"rows_in": 999, "kept": len(df), "quarantined": 4, "merged": 6}
    s = run(df, tmp_path, accounting=acc, min_chars=2)
    assert not s["success"]
    with pytest.raises(GateFailed) as exc:
        validation.check(s)
    msg = str(exc.value)
    assert "EMAIL" in msg and "PHONE" in msg
    assert "1 of 200 rows (0.50%) match the residual EMAIL pattern" in msg
    assert "label_set" not in msg and "outside the label set" in msg
    assert "are null" in msg
    assert "shorter than 2" in msg
    assert "share their normalized text" in msg
    assert "!= rows_in 999" in msg
    # No value from the data anywhere: exception, summary, Data Docs.
    for blob in (msg, all_output_text(tmp_path / "out")):
        assert SECRET not in blob and "zelda" not in blob
        assert "7946 0958" not in blob
        assert "secret_label_value" not in blob
        assert "the same duplicated sentence" not in blob


def test_thresholds_allow_a_share(tmp_path: Path) -> None:
    df = frame()
    df.loc[10:11, "text"] = "the same duplicated sentence"
    assert not run(df, tmp_path / "a", max_duplicate_rate=0.0)["success"]
    assert run(df, tmp_path / "b", max_duplicate_rate=0.05)["success"]


def test_missing_column_fails_the_schema_and_skips_its_checks(tmp_path: Path) -> None:
    s = run(frame().drop(columns=["label"]), tmp_path)
    assert not s["success"]
    assert any("missing required column(s): label" in f for f in s["failures"])
    assert {x["check"] for x in s["skipped"]} >= {"not_null.label", "label_set"}


def test_min_rows(tmp_path: Path) -> None:
    s = run(frame(5), tmp_path, min_rows=1000)
    assert any("5 rows < min_rows 1000" in f for f in s["failures"])


def test_bad_thresholds_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_duplicate_rate"):
        GateThresholds(max_duplicate_rate=2.0)
    with pytest.raises(ValueError, match="min_chars"):
        GateThresholds(min_chars=10, max_chars=5)


def test_normalized_text_key_groups_case_and_punctuation() -> None:
    k = validation.normalized_text_key(pd.Series(["Where is my card?", "where IS my card!!", None]))
    assert k[0] == k[1] and pd.isna(k[2])


def test_accounting_counts_unlabeled_rows(tmp_path):
    """Rows without a label (clean.unlabeled: review) are neither kept nor quarantined:
    the accounting adds them, and says so when it does not add up."""
    df = frame()
    ok = {"rows_in": len(df) + 13, "kept": len(df), "quarantined": 4, "merged": 6, "unlabeled": 3}
    assert run(df, tmp_path / "a", accounting=ok)["success"]
    bad = {**ok, "unlabeled": 0}
    s = run(df, tmp_path / "b", accounting=bad)
    with pytest.raises(GateFailed, match=r"\+ unlabeled 0 = .* != rows_in"):
        validation.check(s)
