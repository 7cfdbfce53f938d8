"""The Spark desensitize job on a small build: every planted value masked in every output
file, rows accounted for, the report, and both masking modes with their key handling."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from core import stage
from core.config import load_config
from demo.builder import BuilderConfig, build_raw
from jobs.spark import clean, dedup, desensitize
from ops import leakscan
from pii import detector as pii

KEY_ENV = "INTENTOPS_PSEUDONYM_KEY"


@pytest.fixture(scope="module")
def upstream(spark, tmp_path_factory: pytest.TempPathFactory):
    """clean + dedup of a 1,500-row build, published in a lake for run 'r1'."""
    root = tmp_path_factory.mktemp("desens")
    build_raw(root / "raw", BuilderConfig(rows=1500, seed=17, fmt="parquet"))
    cfg = load_config(
        overrides={"lake_root": str(root / "lake"), "input.path": str(root / "raw" / "raw.parquet")}
    )
    clean.run(cfg, "r1", spark=spark)
    dedup.run(cfg, "r1", spark=spark)
    return root, cfg


def test_placeholder_masks_every_planted_value(spark, upstream, monkeypatch) -> None:
    root, cfg = upstream
    res = desensitize.run(cfg, "r1", spark=spark)
    out = Path(res.path)
    stats = res.manifest["stats"]
    d = stage.upstream(cfg.lake, "r1", "dedup").manifest["stats"]
    assert stats["kept"] == d["kept"]
    assert stats["merged"] == d["merged_exact"] + d["merged_near"]
    assert stats["rows_with_pii"] > 100
    assert set(stats["entities"]) == set(pii.ENTITY_TYPES)

    values = leakscan.load_needles(root / "raw" / "ground_truth")
    assert leakscan.scan([out], values) == []
    # ...whereas the stage's input does hold them (the scan can fail).
    assert leakscan.scan([Path(stage.upstream(cfg.lake, "r1", "dedup").path) / "kept"], values)

    rep = json.loads((out / "report.json").read_text())
    assert rep["entities"] == stats["entities"]
    assert all(re.search(r"<[A-Z_]+>", s) for v in rep["masked_samples"].values() for s in v)

    kept = spark.read.parquet(str(out / "kept")).toPandas()
    src = spark.read.parquet(
        str(Path(stage.upstream(cfg.lake, "r1", "dedup").path) / "kept")
    ).toPandas()
    merged = src.merge(
        kept[["record_id", "text", "pii_entities"]], on="record_id", suffixes=("_in", "_out")
    )
    assert len(merged) == len(src) == len(kept)
    for r in merged.itertuples():
        text, ents = pii.mask(r.text_in)
        assert r.text_out == text
        assert list(r.pii_entities) == ents
    # Columns besides text pass through untouched.
    assert set(kept.columns) == set(src.columns) | {"pii_entities"}


def test_second_run_is_a_cache_hit(spark, upstream) -> None:
    _, cfg = upstream
    a = desensitize.run(cfg, "r1", spark=spark)
    b = desensitize.run(cfg, "r1", spark=spark)
    assert b.cache_hit and a.path == b.path


def test_pseudonym_mode_needs_a_key_from_the_environment(spark, upstream, monkeypatch) -> None:
    _, cfg = upstream
    pcfg = cfg.model_copy(
        update={"desensitize": cfg.desensitize.model_copy(update={"mode": "pseudonym"})}
    )
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(stage.StageError, match=KEY_ENV):
        desensitize.run(pcfg, "r2", spark=spark)
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(stage.StageError, match="at least 16"):
        desensitize.run(pcfg, "r2", spark=spark)


def _tokens(spark, path: str) -> pd.DataFrame:
    df = spark.read.parquet(str(Path(path) / "kept")).select("record_id", "text").toPandas()
    return df.sort_values("record_id").reset_index(drop=True)


def test_pseudonyms_are_deterministic_per_key(spark, upstream, monkeypatch) -> None:
    _, cfg = upstream
    pcfg = cfg.model_copy(
        update={"desensitize": cfg.desensitize.model_copy(update={"mode": "pseudonym"})}
    )
    monkeypatch.setenv(KEY_ENV, "first-key-0123456789abcdef")
    src_dir = stage.upstream(cfg.lake, "r1", "dedup").path
    a = desensitize.run(pcfg, "r3", spark=spark, dedup_output=src_dir)
    monkeypatch.setenv(KEY_ENV, "second-key-0123456789abcdef")
    b = desensitize.run(pcfg, "r4", spark=spark, dedup_output=src_dir)
    assert not b.cache_hit and a.key != b.key  # a new key is new output, not a cache hit
    assert "first-key" not in json.dumps(a.manifest) and "second-key" not in json.dumps(b.manifest)
    ta, tb = _tokens(spark, a.path), _tokens(spark, b.path)
    tok = re.compile(r"<[A-Z_]+_[0-9a-f]{10}>")
    assert ta["text"].str.contains(tok).sum() > 100
    assert (ta["text"] != tb["text"]).sum() == ta["text"].str.contains(tok).sum()
    # The same value gives the same token in every row: re-mask a row with the key.
    key = b"first-key-0123456789abcdef"
    src = _tokens(spark, src_dir)
    for i in range(0, len(src), 50):
        assert pii.mask(src.loc[i, "text"], "pseudonym", key)[0] == ta.loc[i, "text"]


def test_a_new_detector_model_is_a_new_stage_key() -> None:
    """The stage's code version covers every module of the detector and its shipped table
    and weights: retrained weights must never be a cache hit on text the old model masked
    (tests/test_stages.py edits a copy and sees the key change)."""
    from core import codeversion, stages
    from pii import model as pii_model

    files = codeversion.code_files(stages.get("desensitize").module)
    assert {pii_model.MODEL.resolve(), pii_model.TABLE.resolve()} <= {f.resolve() for f in files}
    pii_modules = {f.name for f in files if f.parent.name == "pii"}
    assert {"detector.py", "identifiers.py", "names.py", "addresses.py", "model.py", "phones.py",
            "checksums.py"} <= pii_modules
