"""The behavioural checks as pure functions: which checks apply to a dataset (the
placeholder-share rule), the probes file (loading, its errors, labels outside the model's
set), and the checks built from the curated val split with a rule-based predictor."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from core.config import PROJECT_ROOT, TrainingConfig, load_config
from core.stage import StageVerdict
from training import behaviour

CLASSES = ["card_arrival", "change_pin", "lost_or_stolen_card"]


def rule_predict(texts: list[str]) -> list[str]:
    out = []
    for t in texts:
        low = t.lower()
        if "lost" in low:
            out.append("lost_or_stolen_card")
        elif "pin" in low:
            out.append("change_pin")
        else:
            out.append("card_arrival")
    return out


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- which checks apply ---------------------------------------------------------------


def test_placeholder_share_counts_placeholders_and_pseudonyms_once_per_row():
    rows = ["hi <PERSON>, my <EMAIL> and <PHONE>", "card <CARD_3f9a0c17d2>", "plain", "a <b> tag", "<NAME>"]
    assert behaviour.placeholder_share(rows) == (2, 5)


def test_placeholder_invariance_is_skipped_below_the_share_with_a_note():
    train = ["Thanks, <PERSON>"] * 2 + ["my card is lost"] * 998
    note = behaviour.placeholder_skip_note(train, 0.01)
    assert note == ("skipped: 0.2% of training rows hold a placeholder (2 of 1,000), "
                    "below training.min_placeholder_share 1%")
    assert behaviour.placeholder_skip_note(train, 0.002) is None  # at the bar: runs
    assert behaviour.placeholder_skip_note(["Thanks, <PERSON>"] * 10 + ["x"] * 990, 0.01) is None
    assert behaviour.placeholder_skip_note([], 0.01).startswith("skipped: 0% of training rows")


def test_the_users_case_37_masked_rows_skips_the_check():
    # 37 masked rows in 15,000: the model could not learn placeholders carry no intent.
    note = behaviour.placeholder_skip_note(["x <PERSON>"] * 37 + ["x"] * 14963, 0.01)
    assert note and "0.25%" in note and "(37 of 15,000)" in note


def test_config_defaults_and_the_demo_config_use_the_probes_file():
    t = TrainingConfig()
    assert t.min_placeholder_share == 0.01 and t.probes_file == ""
    assert t.min_invariance == 0.95 and t.min_functionality == 0.8
    cfg = load_config()
    assert cfg.training.probes_file == "data/banking77/probes.csv"
    assert cfg.resolve_path(cfg.training.probes_file).is_file()


def test_entities_match_the_detectors():
    from pii.detector import ENTITY_TYPES

    assert behaviour.ENTITIES == ENTITY_TYPES
    assert set(behaviour.SWAP) == set(ENTITY_TYPES)


# -- probes ---------------------------------------------------------------------------


def test_the_demo_probes_are_twenty_banking77_intents():
    probes = behaviour.load_probes(PROJECT_ROOT / "data" / "banking77" / "probes.csv")
    labels = json.loads((PROJECT_ROOT / "data" / "banking77" / "categories.json").read_text())
    assert len(probes) == 20 and len({y for _, y in probes}) == 20
    behaviour.check_probe_labels(probes, labels)  # every label is a Banking77 intent
    assert ("I lost my card, please block it", "lost_or_stolen_card") in probes


def test_probes_load_with_canonical_labels_extra_columns_and_a_bom(tmp_path):
    f = _write(tmp_path / "p.csv", "\ufeffText,Label,note\n"
               '"Lost it, block it",Lost Or Stolen Card,x\nnew PIN please,change-pin,\n')
    assert behaviour.load_probes(f) == [("Lost it, block it", "lost_or_stolen_card"),
                                        ("new PIN please", "change_pin")]


@pytest.mark.parametrize(("content", "message"), [
    ("text,intent\nhi,card_arrival\n", "needs the columns text,label"),
    ("", "needs the columns text,label"),
    ("text,label\n", "no probes"),
    ("text,label\nhi,card_arrival\n,change_pin\nok,\n", "empty text or label on line(s) 3, 4"),
])
def test_malformed_probes_files_are_errors(tmp_path, content, message):
    f = _write(tmp_path / "p.csv", content)
    with pytest.raises(behaviour.ProbesError, match=message.replace("(", r"\(").replace(")", r"\)")):
        behaviour.load_probes(f)


def test_a_missing_probes_file_is_an_error(tmp_path):
    with pytest.raises(behaviour.ProbesError, match="cannot read it"):
        behaviour.load_probes(tmp_path / "absent.csv")


def test_probes_with_labels_outside_the_models_set_are_an_error_not_dropped():
    probes = [("I lost my card", "lost_or_stolen_card"), ("what rate?", "exchange_rate"),
              ("top-up failed", "top_up_failed")]
    with pytest.raises(behaviour.ProbesError) as exc:
        behaviour.check_probe_labels(probes, CLASSES, "data/x/probes.csv")
    msg = str(exc.value)
    assert msg.startswith("data/x/probes.csv: 2 of 3 probes have a label outside the model's label set (3 labels)")
    assert "exchange_rate, top_up_failed" in msg
    assert isinstance(exc.value, StageVerdict)  # a retry cannot fix it
    with pytest.raises(behaviour.ProbesError, match="outside the model's label set"):
        behaviour.run_checks(rule_predict, ["my card"], CLASSES, probes=probes)


def test_unknown_labels_are_listed_up_to_five():
    probes = [(f"t{i}", f"label_{i}") for i in range(8)]
    with pytest.raises(behaviour.ProbesError, match=r"label_4, \.\.\. \(3 more\)"):
        behaviour.check_probe_labels(probes, CLASSES)


# -- the checks -----------------------------------------------------------------------


def test_pii_variants_swap_placeholders_or_add_a_masked_sign_off():
    v = behaviour.pii_variants(["Card <CARD> for <PERSON>", "plain text", "mail <EMAIL_3f9a0c17d2>"])
    assert v[0] == "Card <IBAN> for <EMAIL>"
    assert v[1].startswith("plain text ") and "<" in v[1]
    assert v[2] == "mail <PHONE_3f9a0c17d2>"  # a pseudonym keeps its key, changes its type


def test_checks_pass_a_robust_model_and_fail_a_case_sensitive_one():
    texts = ["I lost my card", "How do I change my PIN?", "Where is my card, <PERSON>?", "my card has not come"] * 5
    probes = [("I lost my card", "lost_or_stolen_card"), ("new pin", "change_pin")]
    ok = behaviour.run_checks(rule_predict, texts, CLASSES, probes=probes)
    assert ok["passed"] and ok["skipped"] == []
    assert {c["name"]: c["passed"] for c in ok["checks"]} == {
        "invariance_pii_placeholders": True, "invariance_lowercase": True,
        "invariance_uppercase": True, "minimum_functionality": True}

    def case_sensitive(ts: list[str]) -> list[str]:
        return ["card_arrival" if t.isupper() else p for t, p in zip(ts, rule_predict(ts), strict=True)]

    bad = behaviour.run_checks(case_sensitive, texts, CLASSES, probes=probes)
    assert not bad["passed"]
    assert [c["name"] for c in bad["checks"] if not c["passed"]] == ["invariance_uppercase"]


def test_probe_failures_are_listed_and_the_threshold_applies():
    probes = [("I lost my card", "lost_or_stolen_card"), ("where is it", "change_pin")]
    out = behaviour.run_checks(rule_predict, ["x"], CLASSES, probes=probes, min_functionality=0.8)
    mf = next(c for c in out["checks"] if c["name"] == "minimum_functionality")
    assert mf["rate"] == 0.5 and not mf["passed"] and mf["items"] == 2
    assert mf["failures"] == [{"text": "where is it", "expected": "change_pin", "got": "card_arrival"}]


def test_no_probes_skips_minimum_functionality_with_a_note():
    out = behaviour.run_checks(rule_predict, ["my card"], CLASSES, probes=None)
    assert "minimum_functionality" not in [c["name"] for c in out["checks"]]
    assert out["skipped"] == [{"name": "minimum_functionality",
                               "note": "skipped: no probes (training.probes_file is empty)"}]
    assert out["passed"]


def _curated(n_train_masked: int, n_train: int = 1000) -> pd.DataFrame:
    train = ["my card <PERSON>"] * n_train_masked + ["where is my card"] * (n_train - n_train_masked)
    val = [f"VAL lost card {i}" for i in range(30)] + [f"VAL pin {i}" for i in range(30)]
    test = [f"TEST card {i}" for i in range(50)]
    return pd.DataFrame({"text": train + val + test,
                         "split": ["train"] * n_train + ["val"] * len(val) + ["test"] * len(test)})


def test_checks_are_built_from_a_sample_of_the_val_messages_only():
    seen: list[str] = []

    def recording(texts: list[str]) -> list[str]:
        seen.extend(texts)
        return rule_predict(texts)

    out = behaviour.check_dataset(recording, _curated(300), CLASSES, sample=20,
                                  probes=[("I lost my card", "lost_or_stolen_card")])
    assert out["sample"] == {"split": "val", "items": 20, "of": 60}
    names = [c["name"] for c in out["checks"]]
    assert names == ["invariance_pii_placeholders", "invariance_lowercase", "invariance_uppercase",
                     "minimum_functionality"]
    assert all(c["items"] == 20 for c in out["checks"][:3])
    assert not any("TEST" in t.upper() or "where is my card" in t for t in seen)  # no test, no train rows
    assert sum("VAL" in t.upper() for t in seen) == 20 * 4  # base, PII, lower, upper
    again = behaviour.check_dataset(rule_predict, _curated(300), CLASSES, sample=20)
    assert again["checks"][0]["items"] == 20  # seeded: the same sample every time


def test_check_dataset_skips_the_placeholder_invariance_for_a_dataset_without_placeholders():
    def unlearned(texts: list[str]) -> list[str]:  # placeholders flip every prediction
        return ["card_arrival" if "<" in t else p for t, p in zip(texts, rule_predict(texts), strict=True)]

    run = behaviour.check_dataset(unlearned, _curated(50), CLASSES, sample=60)
    assert not run["passed"] and run["checks"][0]["name"] == "invariance_pii_placeholders"
    out = behaviour.check_dataset(unlearned, _curated(2), CLASSES, sample=60)
    assert out["passed"]
    assert [c["name"] for c in out["checks"]] == ["invariance_lowercase", "invariance_uppercase"]
    assert out["skipped"][0] == {
        "name": "invariance_pii_placeholders",
        "note": "skipped: 0.2% of training rows hold a placeholder (2 of 1,000), "
                "below training.min_placeholder_share 1%"}
    assert out["skipped"][1]["name"] == "minimum_functionality"


def test_an_empty_val_split_skips_the_invariances_with_a_note():
    cur = _curated(300)
    cur = cur[cur.split != "val"]
    out = behaviour.check_dataset(rule_predict, cur, CLASSES, probes=[("I lost my card", "lost_or_stolen_card")])
    assert [c["name"] for c in out["checks"]] == ["minimum_functionality"]
    notes = {s["name"]: s["note"] for s in out["skipped"]}
    assert notes["invariance_lowercase"] == "skipped: no val messages to check"
