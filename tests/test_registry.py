"""The registration gate against a real MLflow server: a better model becomes the
challenger, a worse one is rejected with the reason, a rerun adds no version, every alias
move is in the history; plus the behavioural checks on a rule-based predictor."""

from __future__ import annotations

import threading

import pytest

from training import behaviour, registry

PASS = {"passed": True, "checks": [{"name": "minimum_functionality", "passed": True}]}


@pytest.fixture
def client(mlflow_server):
    from mlflow.tracking import MlflowClient

    return MlflowClient(mlflow_server)


def _run(client, exp: str, acc: float, tmp_path) -> tuple[str, str]:
    exp_id = client.get_experiment_by_name(exp)
    exp_id = exp_id.experiment_id if exp_id else client.create_experiment(exp)
    run = client.create_run(exp_id)
    rid = run.info.run_id
    client.log_metric(rid, "test_accuracy", acc)
    art = tmp_path / rid / "model"
    art.mkdir(parents=True)
    (art / "MLmodel").write_text("artifact_path: model\nflavors: {}\n")
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
        {"name": "invariance_lowercase", "passed": False}]})
    assert not failed["registered"] and "invariance_lowercase" in failed["reason"]

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


def _rule_predict(texts: list[str]) -> list[str]:
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


def test_behavioural_checks_pass_a_robust_model_and_fail_a_case_sensitive_one():
    texts = ["I lost my card", "How do I change my PIN?", "Where is my card, <PERSON>?",
             "my card has not come"] * 5
    classes = ["lost_or_stolen_card", "change_pin", "card_arrival"]
    ok = behaviour.run_checks(_rule_predict, texts, classes, min_functionality=0.5)
    assert {c["name"]: c["passed"] for c in ok["checks"]} == {
        "invariance_pii_placeholders": True, "invariance_lowercase": True,
        "invariance_uppercase": True, "minimum_functionality": True}

    def case_sensitive(ts: list[str]) -> list[str]:
        return ["card_arrival" if t.isupper() else p for t, p in zip(ts, _rule_predict(ts), strict=True)]

    bad = behaviour.run_checks(case_sensitive, texts, classes, min_functionality=0.5)
    assert not bad["passed"]
    assert [c["name"] for c in bad["checks"] if not c["passed"]] == ["invariance_uppercase"]


def test_pii_variants_swap_placeholders_or_add_a_masked_sign_off():
    v = behaviour.pii_variants(["Card <CARD> for <PERSON>", "plain text"])
    assert v[0] == "Card <IBAN> for <EMAIL>"
    assert v[1].startswith("plain text ") and "<" in v[1]




def test_registers_an_mlflow3_logged_model_on_a_server(client, mlflow_server, tmp_path):
    """MLflow 3 logs models as `models:/m-...`; a tracking server rejects that URI as a
    version source without its model id. The gate registers it and it loads back."""
    import mlflow
    import mlflow.pyfunc
    import pandas as pd

    class Upper(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return pd.DataFrame({"label": [str(t).upper() for t in model_input["text"]]})

    mlflow.set_tracking_uri(mlflow_server)
    mlflow.set_experiment("gate-logged-model")
    with mlflow.start_run() as run:
        mlflow.log_metric("test_accuracy", 0.9)
        info = mlflow.pyfunc.log_model(name="model", python_model=Upper(),
                                       input_example=pd.DataFrame({"text": ["a"]}))
    out = registry.register_if_better(client, "gate-logged", info.model_uri, run.info.run_id, "fp-x",
                                      {"test_accuracy": 0.9}, PASS, "test_accuracy", 0.0,
                                      tmp_path / "lock")
    assert out["registered"] and out["version"] == "1"
    loaded = mlflow.pyfunc.load_model("models:/gate-logged@challenger")
    assert loaded.predict(pd.DataFrame({"text": ["hi"]})).label.tolist() == ["HI"]
