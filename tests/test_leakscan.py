"""The leak scanner finds planted personal data wherever it lands, and nothing else."""

from __future__ import annotations

import pandas as pd

from ops import leakscan

SPANS = pd.DataFrame({
    "pii_type": ["email", "card_number", "person_name", "decoy_card", "us_ssn"],
    "value": ["jane.doe@example.org", "4111 1111 1111 1111", "Jane Doe",
              "1234 5678 9012 3456", "123-45-6789"],
})


def test_needles_skip_decoys_and_add_digit_forms():
    n = leakscan.needles(SPANS)
    assert n["4111111111111111"] == "card_number"
    assert n["123456789"] == "us_ssn"
    assert "1234 5678 9012 3456" not in n  # a decoy is not personal data


def test_finds_planted_leaks_in_parquet_json_and_logs(tmp_path):
    clean = tmp_path / "clean"
    clean.mkdir()
    pd.DataFrame({"text": ["my card is <CARD>", "hello <PERSON>"], "n": [1, 2]}).to_parquet(
        clean / "part-0.parquet")
    (clean / "report.json").write_text('{"samples": ["contact <EMAIL>"]}')
    assert leakscan.scan([clean], leakscan.needles(SPANS)) == []

    leaky = tmp_path / "leaky"
    leaky.mkdir()
    pd.DataFrame({"text": ["fine", "card 4111111111111111 here"],
                  "annotations": [[{"annotator": "a", "label": "x"}],
                                  [{"annotator": "JANE DOE", "label": "x"}]]}).to_parquet(
        leaky / "part-0.parquet")
    (leaky / "task.log").write_text("ERROR could not parse jane.doe@example.org\n")
    hits = leakscan.scan([clean, leaky], leakscan.needles(SPANS))
    found = {(h["path"].rsplit("/", 1)[-1], h["entity"], h["where"]) for h in hits}
    assert found == {
        ("part-0.parquet", "card_number", "column text"),
        ("part-0.parquet", "person_name", "column annotations"),
        ("task.log", "email", "text"),
    }
    # The report names file, type and column, never the value.
    assert all("4111" not in str(h) and "jane" not in str(h).lower() for h in hits)


def test_detector_mode_finds_unknown_pii_and_reports_no_value(tmp_path):
    """Without a ground truth the scanner runs the desensitize stage's detector: masked
    text is clean, a card and an e-mail nobody planted are counted, by type and source."""
    clean = tmp_path / "clean"
    clean.mkdir()
    pd.DataFrame({"text": ["my card is <CARD>", "call me <PERSON>", "top up failed"]}).to_parquet(
        clean / "part-0.parquet")
    assert leakscan.detect_scan([clean]) == []

    leaky = tmp_path / "leaky"
    leaky.mkdir()
    pd.DataFrame({"text": ["card 4111 1111 1111 1111 here", "card 5500 0000 0000 0004 too"]}).to_parquet(
        leaky / "part-0.parquet")
    (leaky / "task.log").write_text("INFO ok\nERROR bounced mail to jo.smith@example.org\n")
    hits = leakscan.detect_scan([leaky])
    got = {(h["path"].rsplit("/", 1)[-1], h["entity"], tuple(h["where"]), h["count"]) for h in hits}
    assert got == {("part-0.parquet", "CARD", ("column text",), 2),
                   ("task.log", "EMAIL", ("text",), 1)}
    assert "4111" not in str(hits) and "jo.smith" not in str(hits)
    assert all(h["sources"] for h in hits)
