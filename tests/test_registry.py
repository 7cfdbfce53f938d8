"""The registration gate against a real MLflow server: a better model becomes the
challenger, a worse one is rejected with the reason, a rerun adds no version, every alias
move is in the history; each version records its label list, and a run whose label set
differs from the champion's is refused before it trains; a model that is not registered
fails the register stage's verdict. (The behavioural checks: tests/test_behaviour.py.)"""

from __future__ import annotations

import json
import threading

import pytest

from core.config import PipelineConfig
from core.stage import StageResult, StageVerdict
from training import register_stage, registry
from training import task as train_task

PASS = {"passed": True, "checks": [{"name": "minimum_functionality", "passed": True}]}


@pytest.fixture
def client(mlflow_server):
    from mlflow.tracking import MlflowClient

    return MlflowClient(mlflow_server)


def _run(client, exp: str, acc: float, tmp_path, model_labels: list[str] | None = None) -> tuple[str, str]:
    exp_id = client.get_experiment_by_name(exp)
    exp_id = exp_id.experiment_id if exp_id else client.create_experiment(exp)
    run = client.create_run(exp_id)
    rid = run.info.run_id
    client.log_metric(rid, "test_accuracy", acc)
    art = tmp_path / rid / "model"
    art.mkdir(parents=True)
    (art / "MLmodel").write_text("artifact_path: model\nflavors: {}\n")
    if model_labels is not None:  # where the pyfunc model carries the training output folder
        (art / "artifacts" / "model_dir").mkdir(parents=True)
        (art / "artifacts" / "model_dir" / "labels.json").write_text(json.dumps(model_labels))
    client.log_artifacts(rid, str(art), "model")
    client.set_terminated(rid)
    return rid, f"runs:/{rid}/model"


def test_gate_registers_better_rejects_worse_and_is_idempotent(client, tmp_path):
    name = "gate-test-model"
    lock = tmp_path / "registry.lock"

    def attempt(acc: float, fp: str, checks=PASS):
        rid, uri = _run(client, "gate-test", acc, tmp_path)
        return rid, registry.register_if_better(client, name, uri, rid, fp, {"test_accuracy": acc},
                                                checks, "test_accuracy", 0.005, lock)

    rid1, first = attempt(0.90, "fp-1")
    assert first["registered"] and first["version"] == "1" and "no champion" in first["reason"]
    assert client.get_model_version_by_alias(name, "challenger").version == "1"
    # The operator (or the canary stage) promotes it.
    registry.move_alias(client, name, "champion", "1", "promoted by test")

    rid2, worse = attempt(0.902, "fp-2")  # better, but not by the margin
    assert not worse["registered"]
    assert "does not beat champion v1" in worse["reason"]
    run2 = client.get_run(rid2)
    assert run2.data.tags[registry.REGISTRATION_TAG] == "rejected"
    assert "does not beat" in run2.data.tags[registry.REASON_TAG]

    rid3, better = attempt(0.93, "fp-3")
    assert better["registered"] and better["version"] == "2"
    assert client.get_model_version_by_alias(name, "challenger").version == "2"
    assert client.get_model_version_by_alias(name, "champion").version == "1"

    # The same training run again (a retried task): the version is found, not recreated.
    again = registry.register_if_better(client, name, f"runs:/{rid3}/model", rid3, "fp-3",
                                        {"test_accuracy": 0.93}, PASS, "test_accuracy", 0.005, lock)
    assert again["reused"] and again["version"] == "2"
    assert len(client.search_model_versions(f"name='{name}'")) == 2

    _, failed = attempt(0.99, "fp-4", checks={"passed": False, "checks": [
        {"name": "invariance_lowercase", "passed": False, "rate": 0.876, "threshold": 0.95}]})
    assert not failed["registered"]
    assert failed["reason"] == "behavioural checks failed: invariance_lowercase 0.876 < 0.95"

    history = registry.alias_history(client, name)
    assert [(h["alias"], h["version"], h["previous"]) for h in history] == [
        ("challenger", "1", None), ("champion", "1", None), ("challenger", "2", "1")]


def test_a_different_label_set_than_the_champions_is_rejected(client, tmp_path):
    name = "gate-labels"
    lock = tmp_path / "registry.lock"
    rid, uri = _run(client, "gate-labels", 0.8, tmp_path)
    first = registry.register_if_better(client, name, uri, rid, "fp-a", {"test_accuracy": 0.8}, PASS,
                                        "test_accuracy", 0.0, lock, labels=["a", "b"])
    registry.move_alias(client, name, "champion", first["version"], "test")
    rid2, uri2 = _run(client, "gate-labels", 0.95, tmp_path)
    out = registry.register_if_better(client, name, uri2, rid2, "fp-b", {"test_accuracy": 0.95}, PASS,
                                      "test_accuracy", 0.0, lock, labels=["a", "b", "c"])
    assert not out["registered"] and "label set differs from champion v1" in out["reason"]
    assert "1 label added (c), 0 removed" in out["reason"]


def test_concurrent_registrations_do_not_collide(client, tmp_path):
    name = "gate-concurrent"
    lock = tmp_path / "registry.lock"
    runs = [_run(client, "gate-concurrent", 0.5 + i * 0.1, tmp_path) for i in range(4)]
    results: list[dict] = []

    def go(i: int) -> None:
        rid, uri = runs[i]
        # No champion: every attempt passes the gate, so all four register.
        results.append(registry.register_if_better(client, name, uri, rid, f"fp-{i}",
                                                   {"test_accuracy": 0.5}, PASS, "test_accuracy", 0.0, lock))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = sorted(int(r["version"]) for r in results)
    assert versions == [1, 2, 3, 4]
    assert len(client.search_model_versions(f"name='{name}'")) == 4


def test_registers_an_mlflow3_logged_model_on_a_server(client, mlflow_server, tmp_path):
    """MLflow 3 logs models as `models:/m-...`; a tracking server rejects that URI as a
    version source without its model id. The gate registers it and it loads back."""
    import mlflow
    import mlflow.pyfunc
    import pandas as pd

    class Upper(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return pd.DataFrame({"label": [str(t).upper() for t in model_input["text"]]})

    model_dir = tmp_path / "model_dir"  # what training writes; the pyfunc carries it
    model_dir.mkdir()
    (model_dir / "labels.json").write_text(json.dumps(["a_label", "b_label"]))
    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_experiment("gate-logged-model")
    with mlflow.start_run() as run:
        mlflow.log_metric("test_accuracy", 0.9)
        info = mlflow.pyfunc.log_model(name="model", python_model=Upper(),
                                       artifacts={"model_dir": str(model_dir)},
                                       input_example=pd.DataFrame({"text": ["a"]}))
    out = registry.register_if_better(client, "gate-logged", info.model_uri, run.info.run_id, "fp-x",
                                      {"test_accuracy": 0.9}, PASS, "test_accuracy", 0.0,
                                      tmp_path / "lock")
    assert out["registered"] and out["version"] == "1"
    loaded = mlflow.pyfunc.load_model("models:/gate-logged@challenger")
    assert loaded.predict(pd.DataFrame({"text": ["hi"]})).label.tolist() == ["HI"]
    # Registered without a label list (as before it was recorded): read from the model's files.
    mv = client.get_model_version("gate-logged", "1")
    assert registry.LABEL_LIST_TAG not in mv.tags
    assert registry.version_labels(client, mv, mlflow_server) == ["a_label", "b_label"]


# -- the label set on each version, and refused before training ----------------------


def test_each_version_records_its_label_list(client, tmp_path):
    name = "gate-label-tags"
    rid, uri = _run(client, "gate-label-tags", 0.8, tmp_path)
    out = registry.register_if_better(client, name, uri, rid, "fp-t", {"test_accuracy": 0.8}, PASS,
                                      "test_accuracy", 0.0, tmp_path / "lock", labels=["b_x", "a_y"])
    mv = client.get_model_version(name, out["version"])
    assert json.loads(mv.tags[registry.LABEL_LIST_TAG]) == ["b_x", "a_y"]
    assert mv.tags[registry.LABELS_TAG] == registry.labels_digest(["b_x", "a_y"])
    assert registry.version_labels(client, mv) == ["b_x", "a_y"]


def test_a_label_list_too_long_for_a_tag_is_an_artifact_of_the_run(client, tmp_path):
    name = "gate-label-artifact"
    labels = [f"intent_number_{i:04d}_with_a_long_descriptive_name" for i in range(200)]
    assert len(json.dumps(labels)) > registry.MAX_TAG_VALUE
    rid, uri = _run(client, "gate-label-artifact", 0.8, tmp_path)
    out = registry.register_if_better(client, name, uri, rid, "fp-l", {"test_accuracy": 0.8}, PASS,
                                      "test_accuracy", 0.0, tmp_path / "lock", labels=labels)
    mv = client.get_model_version(name, out["version"])
    assert registry.LABEL_LIST_TAG not in mv.tags
    assert mv.tags[registry.LABEL_ARTIFACT_TAG] == registry.LABEL_ARTIFACT
    assert registry.version_labels(client, mv) == labels
    registry.move_alias(client, name, "champion", out["version"], "test")
    change = registry.champion_label_change(client, name, labels[:-1])
    assert change is not None and change.description.startswith("0 labels added, 1 removed (intent_number_0199")


def test_the_label_change_against_the_champion_names_what_changed(client, tmp_path):
    name = "gate-label-change"
    old = [f"old_{i}" for i in range(8)] + ["kept"]
    assert registry.champion_label_change(client, name, old) is None  # no such model yet
    rid, uri = _run(client, "gate-label-change", 0.8, tmp_path)
    first = registry.register_if_better(client, name, uri, rid, "fp-c", {"test_accuracy": 0.8}, PASS,
                                        "test_accuracy", 0.0, tmp_path / "lock", labels=old)
    assert registry.champion_label_change(client, name, old) is None  # a challenger, no champion
    registry.move_alias(client, name, "champion", first["version"], "test")
    assert registry.champion_label_change(client, name, list(reversed(old))) is None  # same set
    new = ["kept", "new_a", "new_b"]
    change = registry.champion_label_change(client, name, new)
    assert change.champion_version == first["version"]
    assert change.description == ("2 labels added (new_a, new_b), 8 removed (old_0, old_1, old_2, old_3, "
                                  "old_4, ... (3 more)); 3 labels now, 9 in the champion")


def test_a_champion_without_the_list_falls_back_to_its_model_artifacts_then_the_digest(client, tmp_path):
    name = "gate-label-fallback"
    rid, uri = _run(client, "gate-label-fallback", 0.8, tmp_path, model_labels=["a", "b"])
    first = registry.register_if_better(client, name, uri, rid, "fp-f", {"test_accuracy": 0.8}, PASS,
                                        "test_accuracy", 0.0, tmp_path / "lock", labels=["a", "b"])
    v = first["version"]
    client.delete_model_version_tag(name, v, registry.LABEL_LIST_TAG)  # as registered before the tag
    registry.move_alias(client, name, "champion", v, "test")
    assert registry.version_labels(client, client.get_model_version(name, v)) == ["a", "b"]
    change = registry.champion_label_change(client, name, ["a", "c"])
    assert change.description.startswith("1 label added (c), 1 removed (b)")

    rid2, uri2 = _run(client, "gate-label-fallback", 0.8, tmp_path)  # no labels.json in the model
    second = registry.register_if_better(client, name + "-2", uri2, rid2, "fp-g", {"test_accuracy": 0.8}, PASS,
                                         "test_accuracy", 0.0, tmp_path / "lock", labels=["a", "b"])
    client.delete_model_version_tag(name + "-2", second["version"], registry.LABEL_LIST_TAG)
    registry.move_alias(client, name + "-2", "champion", second["version"], "test")
    assert registry.version_labels(client, client.get_model_version(name + "-2", second["version"])) is None
    assert registry.champion_label_change(client, name + "-2", ["a", "b"]) is None  # same digest
    change = registry.champion_label_change(client, name + "-2", ["a", "b", "c"])
    assert change is not None and "digest differs" in change.description


def _cfg(mlflow_server: str, name: str, tmp_path, **training) -> PipelineConfig:
    return PipelineConfig(dataset="mine", lake_root=str(tmp_path / "lake"), tracking={"uri": mlflow_server},
                          training={"registered_model": name, **training})


def test_a_run_with_another_label_set_is_refused_before_training(client, mlflow_server, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    name = "gate-refuse-before-training"
    champion_labels = [f"intent_{i}" for i in range(77)]
    rid, uri = _run(client, "gate-refuse", 0.9, tmp_path)
    first = registry.register_if_better(client, name, uri, rid, "fp-r", {"test_accuracy": 0.9}, PASS,
                                        "test_accuracy", 0.0, tmp_path / "lock", labels=champion_labels)
    registry.move_alias(client, name, "champion", first["version"], "test")
    cfg = _cfg(mlflow_server, name, tmp_path)
    train_task.refuse_label_change(cfg, champion_labels)  # the same set: trains

    run_labels = champion_labels[:70] + [f"other_{i}" for i in range(81)]  # 151 labels
    # Through run(): refused before the MLflow run is created and before torchrun starts.
    labels_file = tmp_path / "labels.json"
    labels_file.write_text(json.dumps(run_labels))

    class Upstream:
        path, manifest = str(tmp_path), {"key": "k", "stats": {}}

    def never(*a, **k):
        raise AssertionError("reached past the label-set check")

    monkeypatch.setattr(train_task.stage, "upstream", lambda *a, **k: Upstream())
    monkeypatch.setattr(train_task.runs, "run_labels_file", lambda *a, **k: labels_file)
    monkeypatch.setattr(train_task.tracking, "find_or_create_run", never)
    monkeypatch.setattr(train_task.subprocess, "run", never)
    monkeypatch.setattr(train_task.stage, "run_stage", never)
    with pytest.raises(StageVerdict) as exc:
        train_task.run(cfg, "manual__1")
    msg = str(exc.value)
    assert msg.startswith(f"training refused: this run's label set differs from that of champion v{first['version']} "
                          f"of the registered model '{name}': 81 labels added (other_0, other_1, other_10, other_11, "
                          "other_12, ... (76 more)), 7 removed (intent_70, intent_71, intent_72, intent_73, "
                          "intent_74, ... (2 more)); 151 labels now, 77 in the champion")
    assert "config key `dataset`, now 'mine'" in msg and "retire the old model" in msg


def test_probes_outside_the_run_label_set_are_refused_before_training(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    probes = tmp_path / "probes.csv"
    probes.write_text("text,label\nI lost my card,lost_or_stolen_card\nwhat rate?,exchange_rate\n")
    cfg = _cfg(mlflow_server, "gate-no-such-model", tmp_path, probes_file=str(probes))
    train_task.preflight(cfg, ["lost_or_stolen_card", "exchange_rate"])
    with pytest.raises(StageVerdict, match=r"1 of 2 probes have a label outside the model's label set "
                                           r"\(1 labels\): exchange_rate"):
        train_task.preflight(cfg, ["lost_or_stolen_card"])


# -- the register stage's verdict -----------------------------------------------------


def _register_result(**stats) -> StageResult:
    return StageResult("register", "k", "lake/register/k", False, {"stats": stats})


def test_a_model_that_was_not_registered_fails_the_register_verdict():
    cfg = PipelineConfig()
    ok = register_stage.check(cfg, _register_result(
        registered=True, version="3", reason="no champion yet; test_accuracy 0.9500",
        checks_skipped=["invariance_pii_placeholders: skipped: 0.25% of training rows hold a placeholder"]))
    assert ok.startswith("registered 3 as challenger: no champion yet") and "checks skipped" in ok
    for reason in ("behavioural checks failed: invariance_pii_placeholders 0.876 < 0.95",
                   "test_accuracy 0.9000 does not beat champion v1 (0.9100) by 0.0"):
        with pytest.raises(StageVerdict, match="model not registered") as exc:
            register_stage.check(cfg, _register_result(registered=False, version=None, reason=reason))
        assert reason in str(exc.value) and "lake/register/k" in str(exc.value)


def test_an_alias_move_that_cannot_be_audited_does_not_happen(client, tmp_path, monkeypatch):
    from core import audit, tracking

    name = "gate-audited"
    rid, uri = _run(client, name, 0.8, tmp_path)
    out = registry.register_if_better(client, name, uri, rid, "fp-audit", {"test_accuracy": 0.8}, PASS,
                                      "test_accuracy", 0.0, tmp_path / "lock")
    v = out["version"]
    recs = [r for r in audit.read() if r["target"] == f"{name}@challenger"]
    assert recs and recs[-1]["outcome"] == f"v{v}" and recs[-1]["actor"]
    blocked = tmp_path / "blocked"
    blocked.write_text("not a folder")
    monkeypatch.setenv("INTENTOPS_AUDIT_LOG", str(blocked / "audit.jsonl"))
    with pytest.raises(audit.AuditError):
        tracking.move_alias(client, name, "champion", v, "promote by hand")
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException):
        client.get_model_version_by_alias(name, "champion")  # nothing moved unrecorded
