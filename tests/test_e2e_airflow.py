"""End to end: the DAG through real `airflow dags test`, real spark-submit, on a small
build of the raw-data builder; then the same run again is a cache hit everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import FAST_PIPELINE_ENV, ROOT

from core import stage
from demo.groundtruth import evaluate

pytestmark = pytest.mark.e2e
ROWS = 4000


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, project_env, mlflow_server):
    base = tmp_path_factory.mktemp("e2e")
    env = dict(project_env)
    env.update(
        AIRFLOW_HOME=str(base / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}',
        INTENTOPS__LAKE_ROOT=str(base / "lake"),
        # Not the checkout's services: no Label Studio here, so the review task skips (saying why).
        INTENTOPS_SERVICES_ROOT=str(base / "services"),
        INTENTOPS__SPARK__DRIVER_MEMORY="2g",
        MLFLOW_TRACKING_URI=mlflow_server,
        INTENTOPS__TRAINING__NPROC_PER_NODE="2",
        INTENTOPS__DEPLOY__ROOT=str(base / "deploy"),  # <root>/<dataset>/
        INTENTOPS__DEPLOY__ROUTER_PORT="0",
        INTENTOPS__DEPLOY__MIN_REQUESTS="15",
        INTENTOPS__DEPLOY__MIN_PROBES="15",
        INTENTOPS__DEPLOY__POLL_SECONDS="0.5",
        **FAST_PIPELINE_ENV,
    )
    # The demo runs' config: configs/pipeline.yaml with the model gates opened. 40 steps of
    # the small encoder give a near-chance model (test accuracy 0.05 to 0.08, loss still
    # ln 77) that no behavioural check passes, and whose logits are so flat that int8 flips
    # up to about a tenth of the argmaxes (92.45% and 88.07% agreement measured on
    # 2026-12-06, 95% to 99% before): the agreement gates, built for real models, would
    # refuse the build at random. These runs are about the wiring; the gates run at their
    # defaults in test_export.py and in the second dataset's run below.
    demo = yaml.safe_load((ROOT / "configs" / "pipeline.yaml").read_text())
    demo["training"] = {**demo.get("training", {}), "min_functionality": 0, "min_invariance": 0}
    demo["export"] = {**demo.get("export", {}), "min_agreement": 0.7, "min_oos_agreement": 0.9}
    (base / "demo.yaml").write_text(yaml.safe_dump(demo))
    raw = base / "raw"
    subprocess.run([sys.executable, "-m", "demo.builder", "--out", str(raw), "--rows", str(ROWS),
                    "--seed", "3", "--format", "csv"], env=env, cwd=ROOT, check=True, timeout=600)
    from core.stages import airflow_setup_commands

    for cmd in airflow_setup_commands(base):
        subprocess.run(["airflow", *cmd], env=env, cwd=ROOT, check=True, timeout=600,
                       capture_output=True)
    # Airflow's StatsD metrics and the stages' own go to the project's bridge, as under
    # `make up` (ops/monitoring/stack.py statsd_env).
    from conftest import _free_port

    from ops.monitoring.stack import MonitoringPorts

    ports = MonitoringPorts(statsd=_free_port(), statsd_http=_free_port())
    env.update(ports.statsd_env())
    bridge = subprocess.Popen([sys.executable, "-m", "ops.monitoring.statsd_bridge", "--udp-port", str(ports.statsd),
                               "--http-port", str(ports.statsd_http)], env=env, cwd=ROOT,
                              stdout=(base / "statsd-bridge.log").open("w"), stderr=subprocess.STDOUT)
    env["TEST_STATSD_METRICS_URL"] = f"{ports.url('statsd_http')}/metrics"
    try:
        yield env, base, raw
    finally:
        bridge.terminate()
        bridge.wait(timeout=20)


def _bridge_metrics(env: dict[str, str]) -> dict[tuple[str, frozenset], float]:
    """The StatsD bridge's samples: (name, labels) -> value."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(env["TEST_STATSD_METRICS_URL"], timeout=10).text
    return {(smp.name, frozenset(smp.labels.items())): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


# The small encoder and a step budget keep each DAG run's training to seconds; the
# behavioural bar is lowered because 40 steps of a from-scratch model cannot meet it,
# and this test is about the wiring (the registry gate has its own tests).
def _demo_config(raw: Path) -> dict[str, str]:
    return {"config_file": str(raw.parent / "demo.yaml")}


TRAIN_CONF = {"model": "small", "epochs": 1, "max_steps": 40, "learning_rate": 0.002,
              "canary_bake_seconds": 3}


def _dags_test(env: dict[str, str], raw: Path) -> subprocess.CompletedProcess:
    conf = json.dumps({"input_path": str(raw / "raw.csv"), **TRAIN_CONF, **_demo_config(raw)})
    return subprocess.run(["airflow", "dags", "test", "intentops_pipeline", "--conf", conf],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)


def _latest(lake: Path) -> tuple[str, dict]:
    name = (lake / "runs" / "LATEST").read_text().strip()
    return name, json.loads((lake / "runs" / name / "summary.json").read_text())


@pytest.fixture(scope="module")
def first_run(airflow_env):
    env, base, raw = airflow_env
    try:
        out = _dags_test(env, raw)
        assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
        yield _latest(base / "lake" / "banking77")
    finally:  # the deploy task leaves the model serving, as it should; the test stops it
        subprocess.run([sys.executable, "-m", "ops.cli", "deploy", "stop"], env=env, cwd=ROOT,
                       timeout=120, check=False)


def test_dag_run_accounts_for_every_row(first_run, airflow_env):
    _, base, raw = airflow_env
    _, summary = first_run
    stages = {s["stage"]: s for s in summary["stages"]}
    gt_rows = len(pd.read_parquet(raw / "ground_truth" / "rows.parquet"))
    c, d = stages["clean"], stages["dedup"]
    assert c["rows_in"] == gt_rows
    # Messages without a label are not quarantined (clean.unlabeled: review): they go on,
    # masked, to label QA, which pre-labels and queues them.
    # (the counts of unlabeled rows are in the stage manifests; the summary table omits them)
    gt = pd.read_parquet(raw / "ground_truth" / "rows.parquet")
    run_name, _ = first_run
    lake = base / "lake" / "banking77"
    cs, ds, ss, qs = (stage.upstream(lake, run_name, n).manifest["stats"]
                      for n in ("clean", "dedup", "desensitize", "labelqa"))
    unlabeled = cs["unlabeled"]
    assert unlabeled == (gt.defect == "missing_label").sum() > 0
    assert "missing_label" not in cs["quarantine_by_reason"]
    assert c["kept"] + c["quarantined"] + unlabeled == c["rows_in"]
    assert d["rows_in"] == c["kept"] and ds["unlabeled"] == unlabeled
    assert d["kept"] + d["merged"] == d["rows_in"]
    assert c["quarantined"] > 0 and d["merged_exact"] > 0 and d["merged_near"] > 0
    s, v = stages["desensitize"], stages["validate"]
    assert ss["rows_in"] == d["rows_in"] + unlabeled and s["kept"] == d["kept"]
    assert ss["unlabeled"] == unlabeled
    assert s["rows_with_pii"] > 0 and s["pii_entities"].get("EMAIL", 0) > 0
    assert v["gate_success"] is True and v["failed_expectations"] == 0
    assert (Path(v["output"]) / "data_docs" / "index.html").exists()
    q = stages["labelqa"]
    assert q["rows_in"] == s["kept"]
    assert q["gate_success"] is True and 0 < q["suspects"] < q["rows_in"]
    assert q["kept"] == q["rows_in"] - q["suspects"]  # suspects excluded (the default)
    assert qs["unlabeled"] == unlabeled and 0 < qs["unlabeled_queued"] <= qs["unlabeled"]
    out = Path(q["output"])
    for f in ("qa_report.html", "relabel_queue.csv", "relabel_queue.json", "curated"):
        assert (out / f).exists(), f


def test_dag_trains_with_torchrun_and_registers_a_challenger(first_run, airflow_env):
    from mlflow.tracking import MlflowClient

    env, base, _ = airflow_env
    run_name, summary = first_run
    stages = {s["stage"]: s for s in summary["stages"]}
    tr, reg = stages["train"], stages["register"]
    assert tr["test_accuracy"] is not None and tr["mlflow_run_id"]
    metrics = json.loads((Path(tr["output"]) / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 40
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run = client.get_run(tr["mlflow_run_id"])
    # Lineage: the data stages and the data-quality record this model trained on.
    lake = base / "lake" / "banking77"
    assert run.data.tags["intentops.data.labelqa_key"] == stage.upstream(lake, run_name, "labelqa").manifest["key"]
    assert run.data.tags["intentops.data_quality_run_id"] == stages["labelqa"]["mlflow_run_id"]
    assert "train_loss" in run.data.metrics and "test_accuracy" in run.data.metrics
    # The default precision, auto, runs in what this machine computes natively.
    import torch

    from training.optim import native_bf16

    assert run.data.params["precision_requested"] == "auto"
    assert run.data.params["precision"] == metrics["precision"] == (
        "bf16" if native_bf16(torch.device("cpu")) else "fp32")
    assert reg["registered"] is True, reg
    # Registered as challenger; the deploy stage then promoted it, so the alias moved on
    # to champion (the deploy test checks that).
    mv = client.get_model_version_by_alias("intentops-banking77", "champion")
    assert mv.version == reg["model_version"] and mv.run_id == tr["mlflow_run_id"]
    import mlflow.pyfunc
    import pandas as pd

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    model = mlflow.pyfunc.load_model("models:/intentops-banking77@champion")
    out = model.predict(pd.DataFrame({"text": ["I lost my card", "how do I top up?"]}))
    assert list(out.columns) == ["label", "score", "oos"] and len(out) == 2
    # the pyfunc keeps the model's contract too: a name is masked before the model sees it
    pair = model.predict(pd.DataFrame({"text": ["my name is Sarah Connor and my card has not arrived",
                                                "my name is <PERSON> and my card has not arrived"]}))
    assert pair.iloc[0].to_dict() == pair.iloc[1].to_dict()
    # Its requirements are the ones its code imports, pinned (declared, not inferred: the
    # inference listed neither torch nor tokenizers, but this project's own distribution).
    reqs = Path(mlflow.pyfunc.get_model_dependencies("models:/intentops-banking77@champion")).read_text().split()
    names = {r.split("==")[0] for r in reqs}
    assert {"torch", "tokenizers", "mlflow", "phonenumbers"} <= names and "intentops" not in names, reqs
    assert all("==" in r and "+" not in r for r in reqs), reqs


def test_dag_exports_onnx_builds_attached_to_the_registered_version(first_run, airflow_env, tmp_path):
    import mlflow
    import numpy as np
    from mlflow.tracking import MlflowClient

    from export.runtime import OnnxClassifier

    env, base, _ = airflow_env
    _, summary = first_run
    stages = {s["stage"]: s for s in summary["stages"]}
    ex, reg = stages["export"], stages["register"]
    assert ex["exported"] is True and ex["model_version"] == reg["model_version"]
    assert ex["export"]["int8_status"] == "passed", ex["export"]
    out = Path(ex["output"])
    report = json.loads((out / "report.json").read_text())
    assert report["parity"]["passed"] and report["parity"]["max_abs_diff"] <= 1e-4
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    mv = client.get_model_version("intentops-banking77", reg["model_version"])
    assert mv.tags["intentops.onnx.int8.status"] == "passed"
    assert json.loads(mv.tags["intentops.onnx.int8.quantization"]).keys() >= {"per_channel", "reduce_range"}
    run = client.get_run(mv.run_id)
    assert run.data.metrics["export_onnx_int8_size_mb"] == report["builds"]["onnx_int8"]["size_mb"]
    assert run.data.metrics["export_int8_speedup_vs_eager_b1"] > 0
    arts = {a.path for a in client.list_artifacts(mv.run_id, f"export/v{mv.version}")}
    assert {f"export/v{mv.version}/{f}" for f in ("report.md", "report.json", "speed.png")} <= arts
    # Metrics linked to the version's model, so its registry page shows them.
    from export.task import version_model_id

    model_id = version_model_id(client, mv)
    assert model_id and "export_onnx_int8_throughput_b32" in {
        m.key for m in client.get_logged_model(model_id).metrics}
    # Each build is an onnx-flavor model that carries its tokenizer: serving needs nothing else.
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    texts = ["I lost my card", "how do I top up?", "my transfer has not arrived"]
    preds = {}
    for b in ("fp32", "int8"):
        uri = mv.tags[f"intentops.onnx.{b}.model_uri"]
        assert mlflow.onnx.load_model(uri).graph.input[0].name == "input_ids"
        folder = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp_path / b))
        clf = OnnxClassifier(folder)
        assert clf.pre["model_version"] == mv.version  # what serving reports
        preds[b] = clf.predict(texts)[0]
    assert len(preds["int8"]) == 3 and np.mean(np.array(preds["int8"]) == np.array(preds["fp32"])) >= 2 / 3
    text = (base / "lake" / "banking77" / "runs" / first_run[0] / "summary.txt").read_text()
    assert "int8 build PASSED" in text and "onnx_int8" in text


def test_dag_deploys_the_version_behind_the_router(first_run, airflow_env):
    """First deployment of the run's version: a plain rollout with the checks, promoted;
    the alias champion moves to it, and the router answers from it."""
    import httpx
    from mlflow.tracking import MlflowClient

    env, base, _ = airflow_env
    _, summary = first_run
    stages = {s["stage"]: s for s in summary["stages"]}
    d, reg = stages["deploy"]["deploy"], stages["register"]
    assert d["decision"] == "promoted", d
    assert d["version"] == reg["model_version"] and d["client_failures"] == 0 and d["client_requests"] > 0
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    rm = client.get_registered_model("intentops-banking77")
    assert rm.aliases.get("champion") == reg["model_version"]
    mv = client.get_model_version("intentops-banking77", reg["model_version"])
    assert mv.tags["intentops.deploy.decision"] == "promoted"
    assert f"deploy/v{mv.version}/rollout.png" in {
        a.path for a in client.list_artifacts(mv.run_id, f"deploy/v{mv.version}")}
    state = json.loads((base / "deploy" / "banking77" / "state.json").read_text())
    key = (base / "deploy" / "banking77" / "secrets" / "client_keys").read_text().split()[0]
    r = httpx.post(f"{state['router']['url']}/v1/predict", json={"text": "my card still has not arrived"},
                   headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert r.status_code == 200 and r.json()["model_version"] == reg["model_version"]
    assert "deploy: version" in (base / "lake" / "banking77" / "runs").joinpath(
        (base / "lake" / "banking77" / "runs" / "LATEST").read_text().strip(), "summary.txt").read_text()


def test_run_report_renders_with_charts_and_links(first_run, airflow_env, tmp_path):
    """The `report` task's page for the run, served by the Airflow plugin's app and opened
    in headless Chromium: no console errors, every section, every chart decoded, every link
    answering 200. Its MLflow copy is an artifact of the registered version (tagged on the
    version) and renders with its charts and no link leading out of the page."""
    import mlflow
    from mlflow.tracking import MlflowClient
    from test_report import ALL_CHARTS, check_page, chromium, plugin_app, serve

    env, base, _ = airflow_env
    run_name, summary = first_run
    stages = {s["stage"]: s for s in summary["stages"]}
    lake = base / "lake" / "banking77"
    assert (lake / "runs" / run_name / "report.html").is_file()
    with serve(plugin_app(lake)) as url, chromium(tmp_path) as driver:
        seen = check_page(driver, f"{url}/runs/{run_name}/report", ALL_CHARTS, url)
        assert any(link.endswith("/files/validate/data_docs/index.html") for link in seen["links"])
        assert any(link.endswith("/files/labelqa/qa_report.html") for link in seen["links"])
        client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        mv = client.get_model_version("intentops-banking77", stages["register"]["model_version"])
        art = f"report/{run_name}/report.html"
        assert art in {a.path for a in client.list_artifacts(mv.run_id, f"report/{run_name}")}
        # The tag names the newest run's report of this version (a rerun adds its own).
        assert mv.tags["intentops.report.artifact"].startswith(f"runs:/{mv.run_id}/report/")
        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        copy = mlflow.artifacts.download_artifacts(artifact_uri=f"runs:/{mv.run_id}/{art}",
                                                   dst_path=str(tmp_path / "mlflow"))
        seen = check_page(driver, Path(copy).as_uri(), ALL_CHARTS)
        assert seen["links"] == []


def test_label_qa_run_is_in_mlflow_and_the_curated_split_is_whole(first_run, airflow_env):
    from mlflow.tracking import MlflowClient

    env, base, raw = airflow_env
    run_name, summary = first_run
    q = {s["stage"]: s for s in summary["stages"]}["labelqa"]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run = client.get_run(q["mlflow_run_id"])
    assert stage.safe_run_id(run.data.tags["intentops.pipeline_run_id"]) == run_name
    assert run.data.metrics["suspects"] == q["suspects"]
    assert "qa_report.html" in {a.path for a in client.list_artifacts(run.info.run_id)}
    cur = pd.read_parquet(Path(q["output"]) / "curated")
    assert set(cur.split) == {"train", "val", "test"}
    assert cur.record_id.is_unique
    # Planted label errors: the curated labels are more often right than the exported ones.
    gt = pd.read_parquet(raw / "ground_truth" / "rows.parquet").set_index("ticket_id")
    from textnorm import normalize_label

    true = gt.true_label.map(normalize_label).reindex(cur.record_id).to_numpy()
    assert (cur.label.to_numpy() == true).mean() > (cur.given_label.to_numpy() == true).mean()


def test_no_planted_personal_data_downstream_of_desensitize(first_run, airflow_env):
    """The leak scanner over every desensitize and gate output and every Airflow task log
    (all stages: logs must not carry PII either) finds none of the planted values."""
    from ops import leakscan

    _, base, raw = airflow_env
    run_name, summary = first_run
    lake = base / "lake" / "banking77"
    roots = [stage.upstream(lake, run_name, n).path
             for n in ("desensitize", "validate", "labelqa", "train", "register", "export", "deploy")]
    roots += [base / "airflow" / "logs", lake / "runs" / run_name, base / "deploy" / "banking77" / "logs"]
    needles = leakscan.load_needles(raw / "ground_truth")
    assert len(needles) > 100
    assert leakscan.scan(roots, needles) == []
    # And the scanner does see them where they legitimately still are: the raw zone.
    assert leakscan.scan([stage.upstream(lake, run_name, "dedup").path], needles)


def test_data_stages_meet_quality_targets(first_run, airflow_env):
    _, base, raw = airflow_env
    run_name, _ = first_run
    lake = base / "lake" / "banking77"
    c = stage.upstream(lake, run_name, "clean")
    d = stage.upstream(lake, run_name, "dedup")
    q = evaluate(raw / "ground_truth", c.path, d.path, 0.8)
    assert q["clean"]["defective_survived"] == 0, q["clean"]
    assert q["clean"]["clean_rows_quarantined"] == 0, q["clean"]
    assert q["dedup"]["exact_recall"]["recall"] == 1.0, q["dedup"]
    assert q["dedup"]["near_recall"]["recall"] >= 0.95, q["dedup"]
    assert q["dedup"]["near_precision"]["precision"] >= 0.99, q["dedup"]
    assert q["dedup"]["exact_precision"]["precision"] >= 0.99, q["dedup"]


def test_second_run_is_a_cache_hit_with_unchanged_output(first_run, airflow_env):
    env, base, raw = airflow_env
    first_name, first = first_run
    outputs = {s["stage"]: s["output"] for s in first["stages"]}
    before = {k: stage.file_fingerprint(v) for k, v in outputs.items()}
    out = _dags_test(env, raw)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    name, second = _latest(base / "lake" / "banking77")
    assert name != first_name
    for s in second["stages"]:
        assert s["cache_hit"], s
        assert s["output"] == outputs[s["stage"]]
        assert stage.file_fingerprint(s["output"]) == before[s["stage"]]
    # A rerun never adds a model version.
    from mlflow.tracking import MlflowClient

    versions = MlflowClient(env["MLFLOW_TRACKING_URI"]).search_model_versions(
        "name='intentops-banking77'")
    assert len(versions) == 1
    # Both runs' task metrics reached Prometheus's side of the StatsD bridge: every stage
    # published once and was a cache hit the second time (the stages' own metrics), and
    # Airflow counted each task's success with its duration.
    metrics = _bridge_metrics(env)

    def value(name: str, **labels: str) -> float:
        return sum(v for (n, ls), v in metrics.items() if n == name and set(labels.items()) <= ls)

    for s in second["stages"]:
        for outcome in ("published", "cache_hit"):
            assert value("intentops_stage_runs_total", stage=s["stage"], dataset="banking77",
                         outcome=outcome) >= 1, (s["stage"], outcome, sorted(n for n, _ in metrics))
        assert value("intentops_stage_duration_seconds_count", stage=s["stage"]) >= 2
    assert value("airflow_ti_finish_total", dag_id="intentops_pipeline", state="success") >= 2 * len(second["stages"])
    assert value("airflow_task_duration_seconds_count", dag_id="intentops_pipeline", task_id="train") >= 2
    assert value("statsd_bridge_bad_lines_total") == 0


def test_gate_failure_is_readable_and_quotes_no_data(first_run, airflow_env):
    """The same run's gate with an impossible bar: exit code 3, each failed expectation
    named with its numbers, and no planted value in the message."""
    from ops import leakscan

    env, _, raw = airflow_env
    run_name, _ = first_run
    out = subprocess.run(
        [sys.executable, "-m", "ops.cli", "validate", "--run-id", run_name,
         "--set", "validation.min_rows=100000000", "--set", "validation.max_duplicate_rate=0"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 3, out.stderr[-3000:]
    assert "validation gate failed" in out.stderr
    assert "rows < min_rows 100000000" in out.stderr
    needles = leakscan.Scanner(leakscan.load_needles(raw / "ground_truth"))
    assert not needles.find(out.stdout + out.stderr)


def test_pseudonym_mode_without_a_key_fails_the_task_with_the_fix(airflow_env, first_run):
    env, _, raw = airflow_env
    env = {k: v for k, v in env.items() if k != "INTENTOPS_PSEUDONYM_KEY"}
    conf = json.dumps({"input_path": str(raw / "raw.csv"), "pii_mode": "pseudonym", **TRAIN_CONF,
                       **_demo_config(raw)})
    out = subprocess.run(["airflow", "dags", "test", "intentops_pipeline", "--conf", conf],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    log = out.stdout + out.stderr
    assert "intentops_pseudonym" in log and "INTENTOPS_PSEUDONYM_KEY" in log, log[-4000:]
    assert "failed" in log.lower()


def test_pseudonym_key_from_the_airflow_connection(airflow_env, first_run):
    """pii_mode=pseudonym with the key in the `intentops_pseudonym` connection: the task
    passes it to spark-submit, tokens are keyed, and the key is in no log or output."""
    env, base, raw = airflow_env
    key = "conn-key-5f0c3a9e1b7d4c2a"
    env = {k: v for k, v in env.items() if k != "INTENTOPS_PSEUDONYM_KEY"}
    env["AIRFLOW_CONN_INTENTOPS_PSEUDONYM"] = json.dumps({"conn_type": "generic", "password": key})
    # The key's only consumer is the desensitize stage: the run is stopped right after it by
    # an impossible validation bar (the first run went through every stage; a refused gate
    # ends the run failed, with the reason), which saves training, export and a rollout.
    env["INTENTOPS__VALIDATION__MIN_ROWS"] = "100000000"
    conf = json.dumps({"input_path": str(raw / "raw.csv"), "pii_mode": "pseudonym", **TRAIN_CONF,
                       **_demo_config(raw)})
    out = subprocess.run(["airflow", "dags", "test", "intentops_pipeline", "--conf", conf],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    log = out.stdout + out.stderr
    assert "rows < min_rows 100000000" in log, log[-6000:]
    lake = base / "lake" / "banking77"
    name, summary = _latest(lake)
    # the stages that ran: through the validation gate, nothing after it
    assert [s["stage"] for s in summary["stages"]] == ["clean", "dedup", "desensitize", "validate"], summary
    res = stage.upstream(lake, name, "desensitize")
    assert res.manifest["config"]["desensitize"]["mode"] == "pseudonym"
    texts = pd.read_parquet(Path(res.path) / "kept", columns=["text"])["text"]
    assert texts.str.contains(r"<EMAIL_[0-9a-f]{10}>").any()
    assert key not in log
    for p in list((base / "airflow" / "logs").rglob("*")) + list(Path(res.path).rglob("*")):
        if p.is_file():
            assert key.encode() not in p.read_bytes(), p


# Banking77's 77 intents regrouped into 11 coarser ones: a second dataset with another label
# set, built from the bundled data the way a user's export looks (one label per message; no
# ids, annotators, timestamps or channels).
COARSE = {
    "card_delivery": ["card_arrival", "card_delivery_estimate", "activate_my_card", "get_physical_card",
                      "order_physical_card", "getting_spare_card", "card_linking", "card_about_to_expire"],
    "card_problem": ["card_not_working", "card_swallowed", "lost_or_stolen_card", "compromised_card",
                     "contactless_not_working", "virtual_card_not_working", "card_acceptance",
                     "pin_blocked", "change_pin", "lost_or_stolen_phone", "passcode_forgotten"],
    "virtual_card": ["getting_virtual_card", "get_disposable_virtual_card", "disposable_card_limits"],
    "top_up": ["automatic_top_up", "pending_top_up", "verify_top_up", "top_up_by_bank_transfer_charge",
               "top_up_limits", "top_up_reverted", "topping_up_by_card", "top_up_by_cash_or_cheque",
               "top_up_failed", "top_up_by_card_charge"],
    "transfer": ["cancel_transfer", "transfer_not_received_by_recipient", "declined_transfer",
                 "pending_transfer", "transfer_timing", "beneficiary_not_allowed", "transfer_fee_charged",
                 "receiving_money", "failed_transfer", "transfer_into_account",
                 "balance_not_updated_after_bank_transfer"],
    "cash": ["pending_cash_withdrawal", "wrong_amount_of_cash_received", "atm_support",
             "declined_cash_withdrawal", "wrong_exchange_rate_for_cash_withdrawal",
             "cash_withdrawal_not_recognised", "cash_withdrawal_charge"],
    "card_payment": ["card_payment_wrong_exchange_rate", "extra_charge_on_statement", "card_payment_fee_charged",
                     "card_payment_not_recognised", "direct_debit_payment_not_recognised",
                     "pending_card_payment", "declined_card_payment", "transaction_charged_twice",
                     "reverted_card_payment?"],
    "currencies_and_support": ["exchange_rate", "fiat_currency_support", "exchange_via_app",
                               "supported_cards_and_currencies", "visa_or_mastercard", "exchange_charge",
                               "apple_pay_or_google_pay", "country_support"],
    "identity": ["edit_personal_details", "why_verify_identity", "unable_to_verify_identity",
                 "verify_source_of_funds", "verify_my_identity", "age_limit"],
    "refund": ["request_refund", "Refund_not_showing_up"],
    "account": ["terminate_account", "balance_not_updated_after_cheque_or_cash_deposit"],
}


def test_a_second_dataset_runs_beside_the_demo_to_its_own_promoted_model(airflow_env, first_run,
                                                                        tmp_path):
    """A user's own export, with its own label set and an out-of-scope label, runs from one
    config file to a model promoted under its own name, every gate at its default, while the
    demo's champion and alias history stay as they were. Two of the coarse intents are held
    back as out of scope (their messages labelled "Out of Scope"): the served model answers
    out of scope for most of their official test messages, which no stage has seen."""
    import httpx
    from mlflow.tracking import MlflowClient

    env, base, _ = airflow_env
    group = {intent: g for g, intents in COARSE.items() for intent in intents}
    categories = json.loads((ROOT / "data" / "banking77" / "categories.json").read_text())
    assert sorted(group) == sorted(categories)  # every intent in exactly one group
    held_back = {"virtual_card", "identity"}
    group = {intent: "Out of Scope" if g in held_back else g for intent, g in group.items()}
    train = pd.read_csv(ROOT / "data" / "banking77" / "train.csv")
    export = train.sample(n=5000, random_state=0)
    export = pd.DataFrame({"utterance": export.text, "topic": export.category.map(group)})
    # JSONL: a few Banking77 messages hold line breaks, which a line-by-line CSV export
    # would turn into malformed records (quarantined, correctly, but not this test's point).
    export.to_json(tmp_path / "coarse.jsonl", orient="records", lines=True)
    config = {
        "dataset": "b77coarse",
        "input": {"path": str(tmp_path / "coarse.jsonl"),
                  "columns": {"id": None, "text": "utterance", "label": "topic", "annotations": None,
                              "created_at": None, "channel": None}},
        "clean": {"label_set": "infer"},
        "oos": {"label": "Out of Scope"},
        "training": {"hparams": {"model": "small", "epochs": 4, "lr": 0.002, "batch_size": 32,
                                 "max_length": 32, "early_stopping_patience": None}},
        "deploy": {"bake_seconds": 3},
    }
    (tmp_path / "coarse.yaml").write_text(yaml.safe_dump(config))
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    demo = "intentops-banking77"
    demo_champion = client.get_model_version_by_alias(demo, "champion").version
    demo_history = client.get_registered_model(demo).tags

    conf = json.dumps({"config_file": str(tmp_path / "coarse.yaml")})
    try:
        out = subprocess.run(["airflow", "dags", "test", "intentops_pipeline", "--conf", conf],
                             env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
        lake = base / "lake" / "b77coarse"
        name, summary = _latest(lake)
        stages = {s["stage"]: s for s in summary["stages"]}
        assert stages["clean"]["quarantined"] == 0 and stages["labelqa"]["suspects"] is not None
        assert stages["register"]["registered"] and stages["deploy"]["deploy"]["decision"] == "promoted"
        labels = json.loads((Path(stage.upstream(lake, name, "clean").path) / "labels.json").read_text())
        kept = sorted(set(COARSE) - held_back | {"out_of_scope"})
        assert labels == kept
        mv = client.get_model_version_by_alias("intentops-b77coarse", "champion")
        assert json.loads(mv.tags["intentops.labels"]) == kept
        assert float(mv.tags["metric.test_oos_recall"]) > 0.5
        # Served: held-back intents' official test messages are mostly answered out of scope,
        # the others mostly in scope with their group.
        test = pd.read_csv(ROOT / "data" / "banking77" / "test.csv").sample(n=600, random_state=1)
        state = json.loads((base / "deploy" / "b77coarse" / "state.json").read_text())
        key = (base / "deploy" / "b77coarse" / "secrets" / "client_keys").read_text().split()[0]
        answers = []
        for i in range(0, len(test), 50):
            r = httpx.post(f"{state['router']['url']}/v1/predict", json={"texts": test.text[i:i + 50].tolist()},
                           headers={"Authorization": f"Bearer {key}"}, timeout=30)
            assert r.status_code == 200, r.text
            answers += r.json()["predictions"]
        truth_oos = test.category.map(group).eq("Out of Scope").tolist()
        oos_recall = sum(a["oos"] for a, t in zip(answers, truth_oos, strict=True) if t) / sum(truth_oos)
        in_scope = [a for a, t in zip(answers, truth_oos, strict=True) if not t]
        assert oos_recall > 0.5, oos_recall
        assert all(a["label"] == "out_of_scope" for a in answers if a["oos"])
        assert sum(not a["oos"] for a in in_scope) / len(in_scope) > 0.8
        assert client.get_experiment_by_name("intentops-b77coarse-training") is not None
        assert (base / "deploy" / "b77coarse" / "state.json").is_file()
        # The demo's model did not move.
        assert client.get_model_version_by_alias(demo, "champion").version == demo_champion
        assert client.get_registered_model(demo).tags == demo_history
    finally:
        subprocess.run([sys.executable, "-m", "ops.cli", "deploy", "stop", "--config",
                        str(tmp_path / "coarse.yaml")], env=env, cwd=ROOT, timeout=120, check=False)


def test_the_train_stage_searches_and_trains_with_the_best_trials_setting(first_run, airflow_env, monkeypatch):
    """training.search through the train stage itself (not the search module alone): a
    two-trial study on the first run's curated data, each trial a torchrun group and an
    MLflow run nested under the training run; the final training uses the best trial's
    learning rate, and the stage's manifest and the run's tags record the study."""
    import shutil

    from mlflow.tracking import MlflowClient

    from core.runs import load_run_config
    from training import task as train_task

    env, base, _ = airflow_env
    run_name, _ = first_run
    lake = base / "lake" / "banking77"
    # A run of its own (its pointers are the first run's upstream outputs), so the first
    # run's train pointer stays as the other tests read it.
    runs = lake / "runs"
    shutil.copytree(runs / run_name, runs / "manual__search",
                    ignore=shutil.ignore_patterns("train.json", "register.json", "export.json", "deploy.json"))
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PATH"):
        monkeypatch.setenv(k, env[k])
    cfg = load_run_config(runs / "manual__search" / "config.json")
    t = cfg.training
    cfg = cfg.model_copy(update={"training": t.model_copy(update={
        "search": t.search.model_copy(update={"enabled": True, "trials": 2, "trial_epochs": 1,
                                              "lr": [1e-6, 3e-3], "pruning": False})})})
    result = train_task.run(cfg, "manual__search")
    assert not result.cache_hit
    s = result.manifest["stats"]["search"]
    assert len(s["trials"]) == 2 and all(x["state"] == "COMPLETE" for x in s["trials"])
    best = max(s["trials"], key=lambda x: x["value"])
    assert s["best_params"] == best["params"] and s["best_value"] == best["value"]
    trained = json.loads((Path(result.path) / "config.json").read_text())
    assert trained["lr"] == s["best_params"]["lr"], trained
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    rid = result.manifest["stats"]["mlflow_run_id"]
    run = client.get_run(rid)
    assert json.loads(run.data.tags["intentops.search.best_params"]) == s["best_params"]
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{rid}'")
    assert sorted(c.data.params["lr"] for c in children) == sorted(str(x) for x in (1e-6, 3e-3))
    assert all(c.info.status == "FINISHED" for c in children)
