"""The raw-data builder: deterministic, every row accounted for, ground truth that is true.

One build of 3,000 rows per format is shared by the module (about 2 s each)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import unicodedata
from pathlib import Path

import pandas as pd
import pytest

from demo import builder as rawdata
from demo.builder import BuilderConfig, build_raw
from pii import checksums as ck
from textnorm import dedup_key, jaccard, normalize_text

ROWS = 3000
VALIDATORS = {
    "card_number": ck.card_number_valid,
    "iban": ck.iban_valid,
    "us_ssn": ck.us_ssn_valid,
    "prc_id": ck.prc_id_valid,
}
DECOY_OF = {
    "decoy_card": "card_number",
    "decoy_iban": "iban",
    "decoy_ssn": "us_ssn",
    "decoy_prc_id": "prc_id",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for fmt in ("csv", "jsonl", "parquet"):
        d = tmp_path_factory.mktemp(f"raw-{fmt}")
        build_raw(d, BuilderConfig(rows=ROWS, seed=5, fmt=fmt))
        out[fmt] = d
    return out


def read_raw(d: Path, fmt: str) -> pd.DataFrame:
    """Parse a raw file the way a lenient reader would: malformed records are skipped."""
    path = d / f"raw.{fmt}"
    if fmt == "parquet":
        return pd.read_parquet(path)
    rows = []
    if fmt == "jsonl":
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return pd.DataFrame(rows)
    text = path.read_text(encoding="utf-8")
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    for rec in reader:
        if len(rec) == len(header):
            rows.append(dict(zip(header, rec, strict=True)))
    return pd.DataFrame(rows)


def gt(d: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    g = d / "ground_truth"
    return (
        pd.read_parquet(g / "rows.parquet"),
        pd.read_parquet(g / "pii_spans.parquet"),
        json.loads((g / "summary.json").read_text()),
    )


def test_same_seed_same_bytes_and_other_seed_differs(tmp_path: Path) -> None:
    def digest(seed: int, name: str) -> tuple[str, str]:
        d = tmp_path / name
        build_raw(d, BuilderConfig(rows=800, seed=seed))
        return (
            hashlib.sha256((d / "raw.csv").read_bytes()).hexdigest(),
            hashlib.sha256((d / "ground_truth" / "pii_spans.parquet").read_bytes()).hexdigest(),
        )

    a, b, c = digest(1, "a"), digest(1, "b"), digest(2, "c")
    assert a == b
    assert a[0] != c[0]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_formats_carry_the_columns_and_every_row_is_in_ground_truth(built, fmt: str) -> None:
    rows, _, summary = gt(built[fmt])
    assert summary["rows"] == ROWS == len(rows)
    assert rows["ticket_id"].is_unique
    raw = read_raw(built[fmt], fmt)
    assert list(raw.columns) == list(rawdata.COLUMNS)
    malformed = int((rows["defect"] == "malformed_record").sum())
    if fmt == "parquet":
        assert malformed == 0  # a typed file cannot carry a broken record
        assert len(raw) == ROWS
    else:
        assert malformed > 0
        # Each malformed record is one physical line that a strict reader rejects.
        assert len(raw) <= ROWS - malformed + 1
    # Accounting: originals + copies + defects = rows.
    copies = sum(summary["dup_kind"].values())
    defects = sum(summary["defect"].values())
    assert summary["originals"] + copies + defects == ROWS


def test_pii_spans_point_at_their_values_and_values_validate(built) -> None:
    rows, spans, summary = gt(built["parquet"])
    raw = read_raw(built["parquet"], "parquet").set_index("ticket_id")
    assert set(summary["pii_type"]) == set(rawdata.PII_TYPES)
    assert set(summary["decoy_type"]) == set(rawdata.DECOY_TYPES)
    for r in spans.itertuples():
        msg = raw.at[r.ticket_id, "message"]
        assert msg[r.start : r.end] == r.value
        value = unicodedata.normalize("NFKC", r.value)
        if r.pii_type in VALIDATORS:
            assert VALIDATORS[r.pii_type](value), (r.pii_type, "planted value fails its validator")
        elif r.pii_type in DECOY_OF:
            assert not VALIDATORS[DECOY_OF[r.pii_type]](value), (r.pii_type, "decoy validates")
        elif r.pii_type == "email":
            assert "@" in value
    with_pii = set(spans.loc[spans["pii_type"].isin(rawdata.PII_TYPES), "ticket_id"])
    assert with_pii == set(rows.loc[rows["has_pii"], "ticket_id"])
    # The share is near the configured 0.3 of the originals (copies inherit PII).
    share = len(with_pii) / ROWS
    assert 0.2 < share < 0.5


def test_several_phone_formats_and_card_groupings(built) -> None:
    _, spans, _ = gt(built["parquet"])
    phones = spans.loc[spans["pii_type"] == "phone", "value"]
    shapes = {
        "".join("9" if ch.isdigit() else ch for ch in unicodedata.normalize("NFKC", v))
        for v in phones
    }
    assert len(shapes) >= 6
    assert any(v.startswith("+44") for v in phones) and any(v.startswith("+49") for v in phones)
    cards = spans.loc[spans["pii_type"] == "card_number", "value"]
    assert any(" " in v for v in cards) and any(v.isdigit() for v in cards)


def test_exact_copies_share_the_dedup_key_and_near_copies_are_near(built) -> None:
    rows, _, _ = gt(built["parquet"])
    raw = read_raw(built["parquet"], "parquet").set_index("ticket_id")
    copies = rows[rows["dup_kind"].notna()]
    assert set(copies["dup_kind"]) == set(rawdata.EXACT_KINDS) | set(rawdata.NEAR_KINDS)
    near_ok = near_n = 0
    for r in copies.itertuples():
        a, b = raw.at[r.ticket_id, "message"], raw.at[r.origin_id, "message"]
        assert r.origin_id != r.ticket_id
        if r.dup_kind in rawdata.EXACT_KINDS:
            assert dedup_key(a) == dedup_key(b), r.dup_kind
        else:
            assert dedup_key(a) != dedup_key(b)
            j = jaccard(normalize_text(a), normalize_text(b))
            assert abs(j - r.dup_jaccard) < 1e-6
            near_n += 1
            near_ok += j >= rawdata.NEAR_DUP_J
    assert near_n > 0 and near_ok / near_n >= 0.9


def test_each_defect_kind_is_present_and_real(built) -> None:
    for fmt in ("csv", "jsonl"):
        rows, _, _ = gt(built[fmt])
        assert set(rows["defect"].dropna()) == set(rawdata.DEFECT_KINDS)
    rows, _, _ = gt(built["parquet"])
    raw = read_raw(built["parquet"], "parquet").set_index("ticket_id")
    labels = set(rawdata.load_label_names())
    seen = set()
    for r in rows[rows["defect"].notna()].itertuples():
        msg, intent = raw.at[r.ticket_id, "message"], raw.at[r.ticket_id, "intent"]
        seen.add(r.defect)
        if r.defect == "empty_text":
            assert msg == ""
        elif r.defect == "whitespace_text":
            assert msg and not msg.strip()
        elif r.defect == "missing_label":
            assert not intent
        elif r.defect == "unknown_label":
            assert intent not in labels and intent
        elif r.defect == "control_chars":
            assert any(unicodedata.category(ch) == "Cc" and ch not in "\t\n\r" for ch in msg)
        elif r.defect == "mojibake":
            assert any(s in msg for s in ("Ã", "â€", "Â"))
        elif r.defect == "too_long":
            assert len(msg) > rawdata.TOO_LONG_CHARS - 1
    assert seen == set(rawdata.DEFECT_KINDS) - {"malformed_record"}


def test_annotations_are_json_and_error_rate_zero_means_all_correct(tmp_path: Path) -> None:
    build_raw(tmp_path, BuilderConfig(rows=600, seed=3, label_error_rate=0.0, fmt="parquet"))
    rows, _, summary = gt(tmp_path)
    assert summary["label_errors"]["wrong_annotations"] == 0
    ok = rows[rows["defect"].isna()]
    for r in ok.itertuples():
        anns = json.loads(r.annotator_labels)
        assert 1 <= len(anns) <= 3
        assert all(a["label"] == r.true_label for a in anns)


def test_planted_label_errors_follow_the_rate(built) -> None:
    _, _, summary = gt(built["parquet"])
    rate = summary["label_errors"]["wrong_rate"]
    assert 0.05 < rate < 0.11  # configured 0.08
    assert summary["label_errors"]["single_annotator_rows"] > 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--rows", "0"],
        ["--pii-share", "1.5"],
        ["--exact-dup-share", "0.5", "--near-dup-share", "0.6"],
        ["--format", "xml"],
    ],
)
def test_bad_config_is_a_usage_error(tmp_path: Path, argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        rawdata.main(["--out", str(tmp_path), *argv])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err
