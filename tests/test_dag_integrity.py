"""DAG integrity: it imports cleanly, parses without I/O or heavy imports, and every task
has retries with backoff and a timeout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
from conftest import ROOT

DAG_FILE = ROOT / "dags" / "intentops_pipeline.py"


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    import os

    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow_home")))
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "intentops_pipeline" in dagbag.dags


def test_every_task_has_retries_backoff_and_timeout(dagbag):
    dag = dagbag.dags["intentops_pipeline"]
    for t in dag.tasks:
        if t.task_id == "watcher":  # it only reports a failure; retrying it changes nothing
            continue
        assert t.retries >= 1, t.task_id
        assert t.retry_exponential_backoff, t.task_id
        assert t.execution_timeout is not None and t.execution_timeout <= timedelta(hours=2), t.task_id


def test_dag_level_settings(dagbag):
    dag = dagbag.dags["intentops_pipeline"]
    assert dag.max_active_runs == 1
    assert dag.doc_md and "Params" in dag.doc_md
    # Daily with an interval, or on the monitoring DAG's drift / new-labels assets.
    assert type(dag.timetable).__name__ == "AssetOrTimeSchedule"
    assert type(dag.timetable.timetable).__name__ == "CronDataIntervalTimetable"
    from core import assets

    names = {ref["name"] for ref in _asset_refs(dag.timetable.asset_condition)}
    assert names == {a[0] for a in assets.RETRAIN_TRIGGERS}
    assert {"input_path", "input_format", "min_chars", "max_chars", "dedup_threshold"} <= set(dag.params.keys())
    ids = [t.task_id for t in dag.topological_sort()] if hasattr(dag, "topological_sort") else None
    order = ids or [t.task_id for t in dag.tasks]
    assert order.index("clean") < order.index("dedup") < order.index("summary")


def test_experiment_dag_trains_alone_in_the_training_pool(dagbag):
    """Training on a finished run's data: no Spark stage, nothing past training; its train
    task queues for the same pool as the pipeline's, so the two contend and preempt."""
    from core.runs import SOURCE_RUN
    from core.stages import TRAINING_POOL

    dag = dagbag.dags["intentops_experiment"]
    pipeline = dagbag.dags["intentops_pipeline"]
    assert {t.task_id for t in dag.tasks} == {"resolve_experiment", "train", "summary"}
    train = dag.get_task("train")
    assert train.pool == TRAINING_POOL == pipeline.get_task("train").pool
    assert train.upstream_task_ids == {"resolve_experiment"}
    assert train.retries >= 1 and train.execution_timeout is not None
    assert SOURCE_RUN in dag.params and "training_priority" in dag.params
    assert dag.schedule is None if hasattr(dag, "schedule") else True


def _asset_refs(cond) -> list[dict]:
    """The assets of an asset condition, however it is nested (``a | b``)."""
    objs = getattr(cond, "objects", None)
    if objs is None:
        return [{"name": cond.name, "uri": cond.uri}]
    return [r for o in objs for r in _asset_refs(o)]


def test_monitoring_dag_emits_the_assets_the_pipeline_runs_on(dagbag):
    from core import assets

    dag = dagbag.dags["intentops_monitoring"]
    assert dag.max_active_runs == 1 and dag.doc_md
    tasks = {t.task_id: t for t in dag.tasks}
    assert set(tasks) == {"check", "emit_drift", "emit_new_labels", "emit_review"}
    emitted = {t.task_id: {o.name for o in t.outlets} for t in dag.tasks if t.outlets}
    assert emitted == {"emit_drift": {assets.DRIFT[0]}, "emit_new_labels": {assets.NEW_LABELS[0]},
                       "emit_review": {assets.REVIEW[0]}}
    for t in dag.tasks:
        assert t.retries >= 1 and t.retry_exponential_backoff and t.execution_timeout is not None, t.task_id


def test_summary_always_runs_and_a_failed_stage_still_fails_the_run(dagbag):
    dag = dagbag.dags["intentops_pipeline"]
    tasks = {t.task_id: t for t in dag.tasks}
    assert tasks["summary"].trigger_rule == "all_done"
    assert tasks["watcher"].trigger_rule == "one_failed"
    assert tasks["watcher"].upstream_task_ids == {"deploy"}
    assert tasks["deploy"].upstream_task_ids == {"export", "labelqa", "resolve_config"}
    assert {"canary_steps", "canary_bake_seconds"} <= set(dag.params.keys())


def test_stage_tasks_are_the_registrys_stages_in_its_order(dagbag):
    """The DAG's stage tasks are core/stages.py's, wired to their declared upstreams, and
    every other task is one of the known non-stage tasks."""
    from core import stages

    dag = dagbag.dags["intentops_pipeline"]
    tasks = {t.task_id: t for t in dag.tasks}
    others = {"resolve_config", "summary", "watcher", "report", "review_pull", "train_nodes", "train_node"}
    assert set(tasks) == set(stages.NAMES) | others
    order = [t.task_id for t in dag.topological_sort()] if hasattr(dag, "topological_sort") else None
    if order:  # review and train are independent branches after labelqa
        seq = [n for n in order if n in stages.NAMES and n != "review"]
        assert seq == [n for n in stages.NAMES if n != "review"]
    for s in stages.STAGES:
        t = tasks[s.name]
        assert t.upstream_task_ids == set(s.upstream) | {"resolve_config"}, s.name
        assert t.retries == s.retries and t.execution_timeout == timedelta(minutes=s.timeout_minutes)
        if s.pool:
            assert t.pool == s.pool
    assert tasks["summary"].upstream_task_ids == {stages.NAMES[-1], "resolve_config"}
    assert tasks["report"].upstream_task_ids == {"summary", "resolve_config"}


def test_review_push_runs_after_a_stopped_label_qa_and_the_pull_is_a_rescheduling_sensor(dagbag):
    dag = dagbag.dags["intentops_pipeline"]
    tasks = {t.task_id: t for t in dag.tasks}
    # The queue is sent even when label QA's gate stopped the run: that is when it matters.
    assert tasks["review"].trigger_rule == "all_done"
    assert "review" not in tasks["train"].upstream_task_ids  # training never waits for people
    pull = tasks["review_pull"]
    assert pull.upstream_task_ids == {"review", "resolve_config"}
    assert pull.mode == "reschedule" and pull.soft_fail and pull.poke_interval >= 30
    assert pull.timeout <= 2 * 60 * 60  # labeling.pull_wait_minutes ends the wait sooner


def test_the_trigger_form_is_the_configs(dagbag):
    from core import params

    dag = dagbag.dags["intentops_pipeline"]
    assert list(dag.params.keys()) == [params.CONFIG_FILE, *params.ALIASES]
    form = params.form()
    for name in form:
        p = dag.params.get_param(name)
        assert p.value is None  # empty: the configured value
        schema = {k: v for k, v in form[name].items() if k not in ("default", "description")}
        assert {k: p.schema.get(k) for k in schema} == schema, name
        assert p.description == form[name]["description"]


def test_spark_stages_use_spark_submit_and_the_default_connection(dagbag):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    dag = dagbag.dags["intentops_pipeline"]
    spark_tasks = [t for t in dag.tasks if isinstance(t, SparkSubmitOperator)]
    assert {t.task_id for t in spark_tasks} == {"clean", "dedup", "desensitize"}
    for t in spark_tasks:
        assert t._conn_id == "spark_default"
        assert (ROOT / t.application).exists() or (ROOT / "jobs" / "spark" / f"{t.task_id}.py").exists()


@pytest.mark.parametrize("dag_file", [DAG_FILE, ROOT / "dags" / "intentops_monitoring.py",
                                      ROOT / "dags" / "intentops_experiment.py"])
def test_parsing_does_no_io_and_no_heavy_imports(dag_file):
    """Parse the DAG file in a fresh interpreter with open() and connection lookups trapped."""
    probe = textwrap.dedent(
        f"""
        import builtins, importlib.util, json, sys
        import airflow.sdk  # warm Airflow's own imports first
        from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
        from airflow.sdk import BaseHook
        opened = []
        real_open = builtins.open
        def trap_open(file, *a, **k):
            opened.append(str(file))
            return real_open(file, *a, **k)
        def trap_conn(*a, **k):
            raise AssertionError("connection lookup while parsing")
        builtins.open = trap_open
        BaseHook.get_connection = classmethod(trap_conn)
        spec = importlib.util.spec_from_file_location("dag_under_test", {str(dag_file)!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        builtins.open = real_open
        heavy = [m for m in ("pyspark", "torch", "pandas", "mlflow", "great_expectations")
                 if m in sys.modules]
        print(json.dumps({{"opened": opened, "heavy": heavy}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                         timeout=300, env=_airflow_env())
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["opened"] == []
    assert report["heavy"] == []


def _airflow_env():
    import os
    import tempfile

    env = dict(os.environ)
    env.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow_home_"))
    return env


def test_a_stage_verdict_fails_the_task_at_once_with_the_reason(dagbag, monkeypatch, tmp_path):
    """A refused registration (or any verdict that stops the run) is a failed task whose
    error is the reason, not a retried error and never a green task."""
    from airflow.sdk.exceptions import AirflowFailException

    from core import stages
    from core.config import load_config
    from core.runs import save_run_config
    from core.stage import StageResult, StageVerdict

    cfg_path = save_run_config(load_config(overrides={"lake_root": str(tmp_path)}), "r1")
    seen = []

    class Refusing:
        name = "register"

        def run(self, cfg, run_id):
            seen.append(run_id)
            return StageResult("register", "k", str(tmp_path), False, {"stats": {}})

        def verdict(self, cfg, result):
            raise StageVerdict("not registered: test_accuracy 0.41 does not beat champion v3 (0.93)")

    monkeypatch.setattr(stages, "get", lambda name: Refusing())
    task = dagbag.dags["intentops_pipeline"].get_task("register")
    with pytest.raises(AirflowFailException, match="does not beat champion v3"):
        task.python_callable(cfg_path, "r1")
    assert seen == ["r1"]


def test_the_other_nodes_of_a_multi_node_training_start_beside_the_train_task(dagbag, tmp_path):
    """train_nodes waits for what train waits for and maps one train_node per extra node,
    in the nodes' pool; one node (the default) or a fixed external rendezvous: skipped."""
    from airflow.sdk.exceptions import AirflowSkipException

    from core import stages
    from core.config import load_config
    from core.runs import save_run_config

    dag = dagbag.dags["intentops_pipeline"]
    ranks, node, train = dag.get_task("train_nodes"), dag.get_task("train_node"), dag.get_task("train")
    assert ranks.upstream_task_ids == train.upstream_task_ids
    assert node.upstream_task_ids == {"train_nodes", "resolve_config"}
    assert node.pool == stages.TRAINING_NODES_POOL and node.priority_weight == train.priority_weight
    assert stages.TRAINING_NODES_POOL in {name for name, _, _ in stages.POOLS}

    def nodes(**training):
        cfg = load_config(overrides={"lake_root": str(tmp_path), "training": training})
        return ranks.python_callable(save_run_config(cfg, "r1"))

    assert nodes(nnodes=3) == [1, 2]
    assert nodes(nnodes="1:2") == [1]
    for one in ({"nnodes": 1}, {"nnodes": 2, "rdzv_endpoint": "trainer-0:29400"}):
        with pytest.raises(AirflowSkipException):
            nodes(**one)
    with pytest.raises(AirflowSkipException):
        ranks.python_callable(None)


@pytest.mark.parametrize(("options", "archive"), [("", False), ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", False),
                                                  ("-XX:TieredStopAtLevel=1", True), ("", True)])
def test_spark_stages_submit_with_the_run_configs_memory_and_jvm_options(dagbag, tmp_path, monkeypatch, options,
                                                                         archive):
    """The Spark tasks read the driver memory, ``spark.java_options`` and the class archive
    (``spark.class_archive``, when its file exists on the worker) from the run's resolved
    config at run time: what they hand spark-submit (no JVM is started here)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from core.config import load_config

    jsa = tmp_path / "classes.jsa"
    if archive:
        jsa.write_bytes(b"archive")
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake"), "spark.driver_memory": "3g",
                                 "spark.java_options": options, "spark.class_archive": str(jsa)})
    resolved = tmp_path / "config.json"
    resolved.write_text(cfg.model_dump_json())
    seen = {}
    monkeypatch.setattr(SparkSubmitOperator, "execute",
                        lambda self, context: seen.update(conf=dict(self.conf), memory=self._driver_memory))
    task = dagbag.dags["intentops_pipeline"].get_task("clean")
    task = task.__class__(task_id="clean_copy", application=task.application, stage_sections=(),
                          conf=dict(task.conf or {}),
                          application_args=["--resolved-config", str(resolved), "--run-id", "r1"])
    task.execute({})
    assert seen["memory"] == "3g"
    java = {k: v for k, v in seen["conf"].items() if k.endswith("extraJavaOptions")}
    expected = f"{options} -XX:SharedArchiveFile={jsa}".strip() if archive else options
    assert java == ({"spark.driver.extraJavaOptions": expected, "spark.executor.extraJavaOptions": expected}
                    if expected else {})
