"""Experiment runs (dags/intentops_experiment.py): training alone on a finished run's
curated data, with other settings, below the pipeline's priority. The resolution and the
summary here; the experiment DAG under a live scheduler, preempted by a higher-priority
training through the controller `make up` starts: tests/test_services.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from core.config import load_config
from core.runs import (
    EXPERIMENT_PRIORITY,
    SettingsError,
    latest_curated_run,
    resolve_experiment_config,
    save_run_config,
    write_summary,
)
from core.stage import StageResult, run_dir, run_pointer

UPSTREAM = ("clean", "dedup", "desensitize", "validate", "labelqa")


def _pipeline_run(lake_root: Path, run_id: str, lr: float = 0.002, stages=UPSTREAM, **more) -> Path:
    """A pipeline run's folder as the pipeline leaves it: its config and its pointers."""
    cfg = load_config(overrides={"lake_root": str(lake_root), "training.hparams.lr": lr, **more}, env={})
    save_run_config(cfg, run_id)
    for i, name in enumerate(stages):
        res = StageResult(name, f"{name}-key-{run_id}", str(cfg.lake / name / f"{name}-key"), False,
                          {"stage": name, "seconds": 10.0 + i, "stats": {"rows_in": 100, "kept": 90}})
        run_pointer(cfg.lake, run_id, name).write_text(res.to_json())
    return cfg.lake


@pytest.fixture
def env(tmp_path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("INTENTOPS__")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("INTENTOPS__LAKE_ROOT", str(tmp_path / "lake"))
    return tmp_path / "lake"


def test_an_experiment_takes_the_newest_curated_run_and_trains_below_the_pipeline(env):
    lake = _pipeline_run(env, "scheduled__a", lr=0.001)
    time.sleep(0.01)
    _pipeline_run(env, "manual__b", lr=0.003)
    _pipeline_run(env, "manual__c", stages=("clean", "dedup"))  # never reached label QA
    assert latest_curated_run(lake) == "manual__b"

    path, note = resolve_experiment_config("manual__exp1", {"learning_rate": 0.01})
    cfg = json.loads(Path(path).read_text())
    assert cfg["training"]["hparams"]["lr"] == 0.01  # the form over the source run's config
    assert cfg["training"]["priority"] == EXPERIMENT_PRIORITY < load_config(env={}).training.priority
    assert "manual__b" in note
    exp = run_dir(lake, "manual__exp1")
    for name in UPSTREAM:  # the source run's data, pointer for pointer
        assert (exp / f"{name}.json").read_text() == run_pointer(lake, "manual__b", name).read_text()
    assert json.loads((exp / "experiment.json").read_text()) == {"source_run": "manual__b"}
    # An experiment is never a source, and the form's priority wins.
    assert latest_curated_run(lake) == "manual__b"
    path, _ = resolve_experiment_config("manual__exp2", {"source_run": "scheduled__a", "training_priority": 5})
    cfg = json.loads(Path(path).read_text())
    assert cfg["training"]["priority"] == 5 and cfg["training"]["hparams"]["lr"] == 0.001


@pytest.mark.parametrize("conf, says", [
    ({"source_run": "manual__nope"}, "no pipeline run of dataset"),
    ({"source_run": "manual__c"}, "label-QA output"),
    ({"no_such_setting": 1}, "unknown trigger settings"),
    ({"source_run": "manual__two_nodes"}, "trains on the train task's node alone"),
])
def test_a_bad_experiment_fails_before_anything_runs(env, conf, says):
    _pipeline_run(env, "manual__b")
    _pipeline_run(env, "manual__c", stages=("clean",))
    _pipeline_run(env, "manual__two_nodes", **{"training.nnodes": "2"})  # DAG-started nodes
    with pytest.raises(SettingsError, match=says):
        resolve_experiment_config("manual__bad", conf)
    assert not (run_dir(env / "banking77", "manual__bad") / "config.json").exists()


def test_no_pipeline_run_yet_says_so(env):
    with pytest.raises(SettingsError, match="run the pipeline first"):
        resolve_experiment_config("manual__exp", {})


def test_the_summary_counts_only_what_the_experiment_ran(env):
    lake = _pipeline_run(env, "manual__b")
    (lake / "runs" / "LATEST").write_text("manual__b\n")
    path, _ = resolve_experiment_config("manual__exp", {})
    train = StageResult("train", "train-key", str(lake / "train" / "k"), False,
                        {"stage": "train", "seconds": 42.0,
                         "stats": {"test_accuracy": 0.5, "test_macro_f1": 0.4, "train_samples_per_s": 80.0,
                                   "mlflow_run_id": "abc"}})
    run_pointer(lake, "manual__exp", "train").write_text(train.to_json())
    summary = json.loads(Path(write_summary(path, "manual__exp")).read_text())
    assert [r["stage"] for r in summary["stages"]] == ["train"]  # the source's stages are not its work
    assert summary["experiment"] == {"source_run": "manual__b"}
    text = (run_dir(lake, "manual__exp") / "summary.txt").read_text().splitlines()
    assert text[1] == "experiment on the data of run manual__b"
    assert (lake / "runs" / "LATEST").read_text() == "manual__b\n"  # LATEST names pipeline runs
