"""The clean job on small frames: one row per reject reason, normalization, bad files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

import textnorm
from core.config import load_config
from core.stage import StageError
from jobs.spark import clean

HEADER = ["ticket_id", "created_at", "channel", "message", "intent", "annotations"]
TS = "2026-11-01T10:00:00Z"
ANN = '[{"annotator": "ann_01", "label": "Card Arrival"}]'

# (id, message, label, annotations, created_at, expected reason or None)
CASES = [
    ("ok1", "Where is my card?", "card_arrival", ANN, TS, None),
    ("ok2", "Where\u00a0is my  new\tcard\u200b?", " Card Arrival ", "[]", TS, None),
    ("ok3", "Ｍｙ ｃａｒｄ is lost", "lost-or-stolen-card", None, None, None),
    ("empty", "", "card_arrival", "[]", TS, "empty_text"),
    ("blank", "  \t  ", "card_arrival", "[]", TS, "empty_text"),
    ("ctrl", "my card\x07 is late", "card_arrival", "[]", TS, "control_chars"),
    ("esc", "\x1b[31mred\x1b[0m card", "card_arrival", "[]", TS, "control_chars"),
    # A NUL inside a quoted field with doubled quotes: Spark's CSV parser used to drop it.
    ("nul", 'a "declined" message\x00 on my card', "card_arrival", "[]", TS, "control_chars"),
    ("moji", "Iâ€™m still waiting", "card_arrival", "[]", TS, "mojibake"),
    ("short", "?", "card_arrival", "[]", TS, "too_short"),
    ("long", "card " * 300, "card_arrival", "[]", TS, "too_long"),
    ("nolabel", "Where is my card?", "", "[]", TS, "missing_label"),
    ("unknown", "Where is my card?", "card_arival", "[]", TS, "unknown_label"),
    ("badann", "Where is my card?", "card_arrival", "{not json", TS, "bad_annotations"),
    ("badts", "Where is my card?", "card_arrival", "[]", "yesterday", "bad_timestamp"),
    ("ok1", "A second row reusing an id", "card_arrival", "[]", TS, "duplicate_id"),
]


def _write_csv(path, rows, broken_lines=()):
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        for rid, text, label, ann, ts, _ in rows:
            w.writerow([rid, ts or "", "chat", text, label, ann if ann is not None else ""])
        for line in broken_lines:
            fh.write(line + "\n")


def _cfg(tmp_path, path, **over):
    return load_config(
        overrides={"input.path": str(path), "lake_root": str(tmp_path / "lake"), **over}, env={}
    )


@pytest.fixture
def cleaned(spark, tmp_path):
    src = tmp_path / "raw.csv"
    _write_csv(src, CASES, broken_lines=['brk,2026-11-01T10:00:00Z,chat,"never closed,card_arrival,[]'])
    res = clean.run(_cfg(tmp_path, src), run_id="t", spark=spark)
    kept = pd.read_parquet(f"{res.path}/kept")
    quarantine = pd.read_parquet(f"{res.path}/quarantine")
    return res, kept, quarantine


@pytest.mark.parametrize(("rid", "text", "label", "ann", "ts", "reason"), CASES)
def test_each_row_lands_where_expected(cleaned, rid, text, label, ann, ts, reason):
    res, kept, quarantine = cleaned
    if reason is None:
        assert rid in set(kept.record_id)
    elif reason == "missing_label":  # clean.unlabeled: review (the default): not a defect
        unlabeled = pd.read_parquet(f"{res.path}/unlabeled")
        assert list(unlabeled.record_id) == [rid] and unlabeled.label.isna().all()
        assert rid not in set(quarantine.record_id) | set(kept.record_id)
    else:
        hits = quarantine[(quarantine.record_id == rid) & (quarantine.reason == reason)]
        assert len(hits) == 1, quarantine[["record_id", "reason"]]
        assert hits.detail.iloc[0]


def test_malformed_line_is_quarantined_with_its_raw_record(cleaned):
    _, _, quarantine = cleaned
    bad = quarantine[quarantine.reason == "malformed_record"]
    assert len(bad) == 1
    assert "never closed" in bad.raw_record.iloc[0]


def test_every_row_accounted_for(cleaned):
    res, kept, quarantine = cleaned
    stats = res.manifest["stats"]
    assert stats["rows_in"] == len(CASES) + 1
    assert stats["kept"] == len(kept) and stats["quarantined"] == len(quarantine)
    assert stats["kept"] + stats["quarantined"] + stats["unlabeled"] == stats["rows_in"]
    assert stats["unlabeled"] == 1
    expected = pd.Series([c[5] for c in CASES if c[5] and c[5] != "missing_label"]
                         + ["malformed_record"]).value_counts()
    assert stats["quarantine_by_reason"] == expected.to_dict()


def test_unlabeled_rows_are_quarantined_when_configured(spark, tmp_path):
    src = tmp_path / "raw.csv"
    _write_csv(src, [CASES[0], CASES[2]] + [c for c in CASES if c[0] == "nolabel"])
    res = clean.run(_cfg(tmp_path, src, **{"clean.unlabeled": "quarantine"}), run_id="q", spark=spark)
    stats = res.manifest["stats"]
    assert stats["quarantine_by_reason"] == {"missing_label": 1} and stats["unlabeled"] == 0
    assert not (Path(res.path) / "unlabeled").exists()


def test_kept_rows_are_normalized(cleaned):
    _, kept, _ = cleaned
    row = kept.set_index("record_id")
    assert row.loc["ok2", "text"] == "Where is my new card?"
    assert row.loc["ok2", "text"] == textnorm.normalize_text(CASES[1][1])
    assert row.loc["ok2", "label"] == "card_arrival"
    assert row.loc["ok3", "text"] == "My card is lost"
    assert row.loc["ok3", "label"] == "lost_or_stolen_card"
    anns = row.loc["ok1", "annotations"]
    assert [dict(a) for a in anns] == [{"annotator": "ann_01", "label": "card_arrival"}]
    assert pd.isna(row.loc["ok3", "created_at"])


def test_jsonl_and_parquet_with_column_mapping(spark, tmp_path):
    records = [
        {"uid": "a", "body": "Where is my card?", "tag": "card_arrival"},
        {"uid": "b", "body": "", "tag": "card_arrival"},
        {"uid": "c", "body": "Is my top up pending?", "tag": "Pending Top Up"},
    ]
    mapping = {
        "input.columns": {"id": "uid", "text": "body", "label": "tag", "annotations": None,
                          "created_at": None, "channel": None},
    }
    jsonl = tmp_path / "raw.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records) + "\n{truncated\n")
    res = clean.run(_cfg(tmp_path, jsonl, **mapping), spark=spark)
    s = res.manifest["stats"]
    assert (s["rows_in"], s["kept"]) == (4, 2)
    assert s["quarantine_by_reason"] == {"malformed_record": 1, "empty_text": 1}

    pq = tmp_path / "raw.parquet"
    pd.DataFrame(records).to_parquet(pq)
    res = clean.run(_cfg(tmp_path, pq, **mapping), spark=spark)
    assert res.manifest["stats"]["kept"] == 2
    kept = pd.read_parquet(f"{res.path}/kept")
    assert sorted(kept.label) == ["card_arrival", "pending_top_up"]


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        ("", "empty.csv", "input is empty"),
        ("ticket_id,intent\nT1,card_arrival\n", "nomsg.csv", "missing required column"),
        (None, "missing.csv", "not found"),
        ("just some text", "data.txt", "cannot tell the input format"),
        ("not json at all\nstill not\n", "bad.jsonl", "no JSON object"),
    ],
)
def test_bad_files_fail_with_a_message_naming_the_file(spark, tmp_path, content, name, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(StageError, match=message) as info:
        clean.run(_cfg(tmp_path, path), spark=spark)
    assert name in str(info.value)


def test_rerun_after_fixing_the_input_needs_no_cleanup(spark, tmp_path):
    path = tmp_path / "raw.csv"
    path.write_text("ticket_id,intent\nT1,card_arrival\n")
    with pytest.raises(StageError):
        clean.run(_cfg(tmp_path, path), run_id="r", spark=spark)
    _write_csv(path, CASES[:3])
    res = clean.run(_cfg(tmp_path, path), run_id="r", spark=spark)
    assert res.manifest["stats"]["kept"] == 3


def test_label_set_inferred_checked_and_recorded(spark, tmp_path):
    """label_set: infer keeps labels with min_class_count rows and quarantines rarer ones
    (reason rare_label); a file that does not describe the export, or an export with one
    class, fails with a message naming the problem; the set is published as labels.json."""
    import json

    rows = ([(f"a{i}", f"where is my card {i}", "Card Arrival", "[]", TS, None) for i in range(4)]
            + [(f"b{i}", f"I lost my card {i}", "lost-or-stolen-card", "[]", TS, None) for i in range(4)]
            + [("c0", "how old must I be", "age_limit", "[]", TS, None)])
    path = tmp_path / "raw.csv"
    _write_csv(path, rows)
    res = clean.run(_cfg(tmp_path, path, **{"clean.label_set": "infer", "clean.min_class_count": 2}),
                    run_id="r", spark=spark)
    s = res.manifest["stats"]
    assert s["labels"] == ["card_arrival", "lost_or_stolen_card"] and s["rare_labels"] == ["age_limit"]
    assert s["quarantine_by_reason"] == {"rare_label": 1} and s["kept"] == 8
    assert s["label_counts"] == {"card_arrival": 4, "lost_or_stolen_card": 4}
    assert json.loads((Path(res.path) / "labels.json").read_text()) == s["labels"]
    # the out-of-scope label, normalized like every label, must occur in the kept rows
    ok = clean.run(_cfg(tmp_path, path, **{"clean.label_set": "infer", "clean.min_class_count": 2,
                                           "oos.label": "Lost or Stolen Card"}), run_id="r0", spark=spark)
    assert ok.manifest["stats"]["kept"] == 8
    with pytest.raises(StageError, match="oos.label 'out of scope' never occurs among the rows .*card_arrival"):
        clean.run(_cfg(tmp_path, path, **{"clean.label_set": "infer", "clean.min_class_count": 2,
                                          "oos.label": "out of scope"}), run_id="r1", spark=spark)

    other = tmp_path / "labels.json"
    other.write_text(json.dumps(["balance", "transfer", "card_arrival"]))
    with pytest.raises(StageError, match="not in .*labels.json.*'lost_or_stolen_card' \\(4\\).*label_set: infer"):
        clean.run(_cfg(tmp_path, path, **{"clean.labels_file": str(other)}), run_id="r2", spark=spark)
    _write_csv(path, rows[:4])
    with pytest.raises(StageError, match="cannot infer a label set: 1 distinct labels"):
        clean.run(_cfg(tmp_path, path, **{"clean.label_set": "infer", "clean.min_class_count": 2}),
                  run_id="r3", spark=spark)
    with pytest.raises(StageError, match="carry 1 label"):
        clean.run(_cfg(tmp_path, path), run_id="r4", spark=spark)


def test_jvm_nfkc_matches_python_on_every_code_point(spark):
    """nfkc_col (ICU4J) agrees with unicodedata on every code point Python's Unicode
    version assigns, one code point per row (ICU may be newer: unassigned ones are left
    out). Surrogates cannot be sent alone."""
    import sys
    import unicodedata

    from pyspark.sql import functions as F

    chars = [
        chr(c)
        for c in range(sys.maxunicode + 1)
        if not 0xD800 <= c <= 0xDFFF and unicodedata.category(chr(c)) != "Cn"
    ]
    df = spark.createDataFrame(pd.DataFrame({"c": chars}))
    got = df.select("c", clean.nfkc_col(F.col("c")).alias("n")).toPandas()
    want = got["c"].map(lambda c: unicodedata.normalize("NFKC", c))
    diff = got[got["n"] != want]
    assert len(got) == len(chars) > 140_000
    assert diff.empty, diff.head(10).to_dict("records")
    assert spark.createDataFrame([(None,)], "c string").select(
        clean.nfkc_col(F.col("c"))
    ).first()[0] is None
