"""
### intentops: raw customer messages to a curated training set

One DAG for the whole pipeline. Each task is an idempotent stage: it publishes its
output atomically under the lake (`lake_root` in `configs/pipeline.yaml`) with a manifest,
and a rerun with the same input and settings is a cache hit that does no work.

| task | what it does |
|---|---|
| `resolve_config` | resolves the typed config once (YAML + environment + this run's params) and saves it with the run |
| `clean` | Spark: schema, Unicode NFKC, whitespace and control characters, length bounds, label normalization; rejects go to quarantine with a reason code |
| `dedup` | Spark: exact duplicates on the normalized key, then near-duplicates by MinHash LSH; one survivor per cluster, clusters with disagreeing labels flagged |
| `desensitize` | Spark: detects personal data (names, emails, phones, cards, IBANs, SSNs, PRC IDs, addresses, IPs) and masks it with typed placeholders or keyed pseudonyms; nothing downstream sees raw PII |
| `validate` | Great Expectations gate on the desensitized data: schema, nulls, label set, length, residual PII, duplicate rate, row accounting; fails with a readable summary, Data Docs kept in the lake |
| `labelqa` | label QA on the desensitized data: annotator agreement (Cohen, Fleiss, Krippendorff), Dawid-Skene consensus, confident learning (cleanlab) on cross-validated TF-IDF + logistic regression; publishes the curated train/val/test set, the relabel queue (CSV, Label Studio JSON) and an HTML report, logs to the MLflow experiment `intentops-data-quality`; fails below the quality bar, leaving the report and queue in place |
| `train` | `torchrun` process group (2 processes, gloo on CPU) fine-tuning the intent classifier on the curated split; checkpoints every N steps, a retry resumes; MLflow run in `intentops-training` with lineage tags back to every data stage and the QA record; the model logged as a pyfunc |
| `register` | behavioural checks (PII-placeholder and casing invariance, minimum functionality), then the registry gate: a new version with alias `challenger` only when it beats the `champion` by the margin; otherwise the run is tagged rejected with the reason. Runs in the pool `intentops_registry` (one slot) |
| `export` | ONNX fp32 and int8 builds of the registered version, parity-checked, gated and timed, attached to the version |
| `deploy` | canary rollout of the int8 build beside the stable model through the router: traffic steps with a bake time each, canary compared with stable on errors, latency, agreement and probe accuracy; promotes (alias `champion`, old one `previous`) or rolls back with the reason tagged on the version |
| `summary` | rows in, kept, quarantined by reason, duplicates merged, PII by type, gate result and time, per stage |

**Params** (the trigger form): `input_path` and `input_format` of the raw export,
`min_chars` / `max_chars` length bounds, the near-duplicate `dedup_threshold`, the
masking mode `pii_mode`, the gate's `max_duplicate_rate` / `max_residual_pii_rate`, and
the label-QA bar `min_label_alpha` / `max_suspect_rate` with `label_suspects` (what the
curated set does with suspects), the training choice and budget `model`, `epochs`,
`max_steps`, `learning_rate`, and the registration `registration_margin`, and the rollout's `canary_steps` and
`canary_bake_seconds`.
Paths relative to the project root are fine.

**Pseudonym mode** reads its HMAC key from the Airflow connection `intentops_pseudonym`
(the key is its password) or, without it, from the worker's `INTENTOPS_PSEUDONYM_KEY`.

**Trigger** from the UI's trigger form, or
`airflow dags trigger intentops_pipeline --conf '{"input_path": "exports/tickets.csv"}'`,
or `POST /api/v2/dags/intentops_pipeline/dagRuns` with `{"conf": {...}}`.

The Spark stages run through `spark-submit` against the `spark_default` connection:
`local[*]` by default, any Spark master (`spark://...`, `yarn`, `k8s://...`) by
configuration.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, dag, task
from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

PROJECT = Path(__file__).resolve().parent.parent
JOBS = PROJECT / "jobs" / "spark"
CONFIG_REF = "{{ ti.xcom_pull(task_ids='resolve_config') }}"

default_args = {
    "owner": "intentops",
    "retries": 2,
    "retry_delay": timedelta(seconds=20),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
    "execution_timeout": timedelta(minutes=45),
}


class DesensitizeSubmitOperator(SparkSubmitOperator):
    """spark-submit with the pseudonymization key put into the job's environment at run
    time, from the Airflow connection `intentops_pseudonym` when it exists. The key never
    appears in the command line, in XCom or in rendered templates."""

    def execute(self, context):
        import os as _os

        from airflow.sdk import Connection

        try:
            key = Connection.get("intentops_pseudonym").password
        except Exception:  # no such connection: the worker's environment may have the key
            key = None
        key = key or _os.environ.get("INTENTOPS_PSEUDONYM_KEY")
        if key:
            self.env_vars = {**(self.env_vars or {}), "INTENTOPS_PSEUDONYM_KEY": key}
        return super().execute(context)


def spark_stage(task_id: str, cls: type[SparkSubmitOperator] = SparkSubmitOperator):
    return cls(
        task_id=task_id,
        application=str(JOBS / f"{task_id}.py"),
        conn_id="spark_default",
        name=f"intentops-{task_id}",
        application_args=["--resolved-config", CONFIG_REF, "--run-id", "{{ run_id }}"],
        driver_memory=os.environ.get("INTENTOPS_SPARK_DRIVER_MEMORY", "4g"),
        conf={"spark.ui.showConsoleProgress": "false"},
        # The Python that runs the job's driver and workers: the one with this project.
        env_vars={"PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", "python3")},
    )


@dag(
    dag_id="intentops_pipeline",
    doc_md=__doc__,
    # Daily, with a real data interval (the day before the run): each scheduled run owns
    # one day of the export, which is what a backfill replays.
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    # Stages publish under content-addressed keys; one run at a time keeps two runs from
    # racing for the same key's temp directory.
    max_active_runs=1,
    default_args=default_args,
    dagrun_timeout=timedelta(hours=3),
    tags=["intentops", "data"],
    params={
        "input_path": Param(
            # INTENTOPS__INPUT__PATH, the config's own override, sets the default here too
            # (the scaled-out shape and the tests point scheduled runs at their export).
            os.environ.get("INTENTOPS__INPUT__PATH", "var/demo/raw/daily"),
            type="string",
            minLength=1,
            description="Raw export to process: a CSV, JSONL or Parquet file or folder. A folder "
            "of date partitions (date=YYYY-MM-DD/): scheduled and backfill runs read the days "
            "of their data interval, manual runs all of it.",
        ),
        "input_format": Param(
            "auto",
            enum=["auto", "csv", "jsonl", "parquet"],
            description="Format of the export; auto picks by file extension.",
        ),
        "min_chars": Param(
            2, type="integer", minimum=1, description="Shorter messages are quarantined."
        ),
        "max_chars": Param(
            1000, type="integer", minimum=10, description="Longer messages are quarantined."
        ),
        "dedup_threshold": Param(
            0.8,
            type="number",
            exclusiveMinimum=0,
            maximum=1,
            description="Jaccard similarity of 5-byte shingles at or above which two messages are near-duplicates.",
        ),
        "pii_mode": Param(
            "placeholder",
            enum=["placeholder", "pseudonym"],
            description="placeholder: <EMAIL>, <CARD>...; pseudonym: a keyed HMAC token per value "
            "(needs the Airflow connection intentops_pseudonym).",
        ),
        "max_duplicate_rate": Param(
            0.01, type="number", minimum=0, maximum=1,
            description="Gate: largest share of rows whose normalized text repeats after dedup.",
        ),
        "max_residual_pii_rate": Param(
            0.0, type="number", minimum=0, maximum=1,
            description="Gate: largest share of rows still matching a PII pattern after masking.",
        ),
        "min_label_alpha": Param(
            0.8, type="number", minimum=-1, maximum=1,
            description="Label QA gate: smallest Krippendorff's alpha of the annotators "
            "(skipped when every item has one annotation).",
        ),
        "max_suspect_rate": Param(
            0.05, type="number", minimum=0, maximum=1,
            description="Label QA gate: largest share of items whose label is suspect (the relabel queue).",
        ),
        "label_suspects": Param(
            "exclude",
            enum=["exclude", "relabel", "downweight"],
            description="What the curated training set does with suspect labels: leave them out, "
            "take the suggested label, or keep them with a low sample weight.",
        ),
        "model": Param(
            "minilm", enum=["minilm", "small"],
            description="minilm: fine-tune the pretrained MiniLM encoder (the demo default); "
            "small: a small encoder from scratch (fast, for tests).",
        ),
        "epochs": Param(1, type="integer", minimum=1, maximum=50, description="Training epochs."),
        "max_steps": Param(
            None, type=["null", "integer"], minimum=1,
            description="Training budget: stop after this many optimizer steps (empty: no cap).",
        ),
        "learning_rate": Param(
            None, type=["null", "number"], exclusiveMinimum=0,
            description="Peak learning rate (empty: the configured one, 2e-4 for MiniLM).",
        ),
        "canary_steps": Param(
            [10, 25, 50, 100], type="array", items={"type": "integer", "minimum": 1, "maximum": 100},
            minItems=1,
            description="Canary traffic steps in percent, rising, ending at 100.",
        ),
        "canary_bake_seconds": Param(
            20, type="number", exclusiveMinimum=0, maximum=3600,
            description="Seconds of live traffic per canary step, at least, before it is judged.",
        ),
        "registration_margin": Param(
            0.0, type="number", minimum=0, maximum=1,
            description="Register only when test accuracy beats the champion's by at least this.",
        ),
    },
)
def intentops_pipeline():
    @task(retries=1)
    def resolve_config(params: dict, run_id: str, dag_run=None, data_interval_start=None,
                       data_interval_end=None) -> str:
        """Resolve the config once for the run and save it; later tasks read the file.

        A scheduled or backfill run over a folder of date partitions reads only the days of
        its data interval; an interval with no partition skips the run (nothing to do is
        not a failure)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from core import partitions as parts
        from core.config import PROJECT_ROOT
        from core.runs import resolve_run_config

        run_type = getattr(dag_run, "run_type", None)
        run_type = str(getattr(run_type, "value", run_type) or "")
        days = None
        if run_type in ("scheduled", "backfill"):
            root = Path(params["input_path"])
            days = parts.for_interval(root if root.is_absolute() else PROJECT_ROOT / root,
                                      data_interval_start, data_interval_end)
            if days == []:
                raise AirflowSkipException(
                    f"{params['input_path']}: no date partition in the data interval "
                    f"[{data_interval_start}, {data_interval_end})")
            print(f"{run_type} run for [{data_interval_start}, {data_interval_end}): "
                  f"{'reads ' + ', '.join(days) if days else 'the input is not date-partitioned; reads all of it'}")
        return resolve_run_config(
            run_id,
            {
                "input.partitions": days,
                "input.path": params["input_path"],
                "input.format": params["input_format"],
                "clean.min_chars": params["min_chars"],
                "clean.max_chars": params["max_chars"],
                "dedup.threshold": params["dedup_threshold"],
                "desensitize.mode": params.get("pii_mode"),
                "validation.max_duplicate_rate": params.get("max_duplicate_rate"),
                "validation.max_residual_pii_rate": params.get("max_residual_pii_rate"),
                "labelqa.min_alpha": params.get("min_label_alpha"),
                "labelqa.max_suspect_rate": params.get("max_suspect_rate"),
                "labelqa.suspects": params.get("label_suspects"),
                "training.margin": params.get("registration_margin"),
                "deploy.steps": params.get("canary_steps"),
                "deploy.bake_seconds": params.get("canary_bake_seconds"),
            },
            training_hparams={"model": params.get("model"), "epochs": params.get("epochs"),
                              "max_steps": params.get("max_steps"), "lr": params.get("learning_rate")},
        )

    @task
    def validate(config_path: str, run_id: str) -> str:
        """Great Expectations gate. A failed expectation is a property of the data, not a
        transient error: AirflowFailException fails the task at once (retries are for
        I/O errors only), naming what failed and by how
        much; the Data Docs stay in the lake (path in the log)."""
        from airflow.sdk.exceptions import AirflowFailException

        from core.runs import load_run_config
        from quality import gate, validation

        result = gate.run(load_run_config(config_path), run_id)
        print(f"validation result and Data Docs: {result.path}")
        try:
            gate.check(result)
        except validation.GateFailed as exc:
            raise AirflowFailException(str(exc)) from None
        return result.path

    @task
    def labelqa(config_path: str, run_id: str) -> str:
        """Label QA. Like the validation gate, the stage publishes its outputs first and
        then fails the task at once (AirflowFailException, no retries) when label quality
        is below the bar; the report and the relabel queue stay in the lake for people to
        act on (path in the log and the error)."""
        from airflow.sdk.exceptions import AirflowFailException

        from core.runs import load_run_config
        from quality import labelqa as qa

        result = qa.run(load_run_config(config_path), run_id)
        print(f"label QA report, relabel queue and curated set: {result.path}")
        print(f"MLflow data-quality run: {result.manifest['stats'].get('mlflow_run_id')}")
        try:
            qa.check(result)
        except qa.QAGateFailed as exc:
            raise AirflowFailException(str(exc)) from None
        return result.path

    @task(retries=2)
    def train(config_path: str, run_id: str) -> str:
        """torchrun process group; a retry resumes from the newest checkpoint."""
        from core.runs import load_run_config
        from training import task as t

        result = t.train(load_run_config(config_path), run_id)
        s = result.manifest["stats"]
        print(f"test accuracy {s.get('test_accuracy')}, MLflow run {s.get('mlflow_run_id')}, "
              f"model {s.get('model_uri')}")
        return result.path

    @task(pool="intentops_registry")
    def register(config_path: str, run_id: str) -> str:
        """The registry gate. Serialized by the one-slot pool (and a file lock)."""
        from core.runs import load_run_config
        from training import task as t

        result = t.register(load_run_config(config_path), run_id)
        s = result.manifest["stats"]
        if s["registered"]:
            print(f"registered {s['version']} as challenger: {s['reason']}")
        else:
            print(f"not registered (run tagged rejected): {s['reason']}")
        return result.path

    @task(retries=1)
    def export(config_path: str, run_id: str) -> str:
        """ONNX fp32 and int8 builds of the registered version, checked and timed, attached
        to the version. fp32 parity failing is a property of the model, not a transient
        error: it fails the task at once. An int8 build that misses its accuracy gate is
        attached marked failed (serving refuses it); the task itself succeeds."""
        from airflow.sdk.exceptions import AirflowFailException

        from core.runs import load_run_config
        from export import task as ex
        from export.onnx_build import ExportError

        try:
            result = ex.export(load_run_config(config_path), run_id)
        except ExportError as exc:
            raise AirflowFailException(str(exc)) from None
        s = result.manifest["stats"]
        if not s["exported"]:
            print(f"export skipped: {s['reason']}")
        else:
            r = s["ratios"]
            print(f"version {s['model_version']}: int8 {s['int8_status']} ({s['int8_reason']}); "
                  f"int8 {r['int8_speedup_vs_eager_b1']:.2f}x eager at batch 1, "
                  f"{r['int8_throughput_vs_fp32_b32']:.2f}x fp32 throughput at batch 32, "
                  f"{r['int8_size_share_of_fp32']:.1%} of the fp32 size; report {result.path}/report.md")
        return result.path

    @task(retries=1, execution_timeout=timedelta(minutes=30))
    def deploy(config_path: str, run_id: str) -> str:
        """Canary rollout of the exported int8 build (deploy/canary.py). A rollback or a
        refused build is a verdict, not a transient error: the stage records it (tags on
        the version, rollout chart in MLflow) and the task fails at once with the reason."""
        from airflow.sdk.exceptions import AirflowFailException

        from core.runs import load_run_config
        from deploy import task as dt

        cfg = load_run_config(config_path)
        result = dt.deploy(cfg, run_id)
        s = result.manifest["stats"]
        print(f"deploy: {s['decision']}: {s['reason']}")
        if s["decision"] in dt.FAILED_DECISIONS:
            raise AirflowFailException(f"version {s.get('version')} {s['decision']}: {s['reason']}")
        if s["decision"] in ("promoted", "already_serving"):
            stable = dt.ensure_serving(cfg)  # a cache hit after `intentops deploy stop`
            print(f"serving version {stable and stable['version']} behind the router at {dt.router_url(cfg)}")
        return result.path

    # The summary runs whatever the verdicts were, so a run that stopped at a gate or
    # rolled back still gets its per-stage summary; `watcher` then keeps such a run failed
    # (a DAG run's state follows its leaves, and the summary alone would say success).
    @task(trigger_rule="all_done")
    def summary(config_path: str, run_id: str) -> str:
        """Per-stage summary of the run, logged and saved beside the run's pointers."""
        from airflow.sdk.exceptions import AirflowSkipException

        from core.runs import write_summary

        if config_path is None:  # resolve_config skipped (no data in the interval) or failed
            raise AirflowSkipException("the run's config was never resolved: nothing to summarize")

        return write_summary(config_path, run_id)

    config_path = resolve_config()
    clean = spark_stage("clean")
    dedup = spark_stage("dedup")
    desensitize = spark_stage("desensitize", DesensitizeSubmitOperator)
    gate = validate(config_path)
    qa = labelqa(config_path)
    trained = train(config_path)
    registered = register(config_path)
    exported = export(config_path)
    config_path >> clean >> dedup >> desensitize >> gate >> qa >> trained >> registered >> exported
    @task(trigger_rule="one_failed", retries=0)
    def watcher() -> None:
        """Fails the run when any stage failed (Airflow's watcher pattern)."""
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException("a stage of this run failed; see its log and the summary")

    # The HTML run report, for failed runs too (all_done); the plugin in plugins/ shows it
    # as the "Run report" tab of the run's page. Not a leaf that hides a failure: the run
    # still fails through `watcher`.
    @task(trigger_rule="all_done")
    def report(config_path: str, run_id: str, ti=None) -> str:
        """The run's HTML report (stage summaries, charts, the canary decision), written
        beside the run's pointers and logged to the registered model version in MLflow."""
        from airflow.sdk.exceptions import AirflowSkipException

        from ops import report as run_report

        if config_path is None:  # as in summary: no resolved config, nothing to report on
            raise AirflowSkipException("the run's config was never resolved: no report")
        # Why stages published nothing (failed, upstream_failed) is known to Airflow only.
        states = (ti.get_task_states(dag_id=ti.dag_id, run_ids=[run_id]).get(run_id) or {}) if ti else {}
        path, uri = run_report.publish(config_path, run_id, {k: str(v) for k, v in states.items()})
        print(f"run report: {path}; in the Airflow UI: the run's 'Run report' tab "
              f"(/intentops/runs/<run_id>/report); MLflow artifact: {uri or 'none (no version registered)'}")
        return str(path)

    deployed = deploy(config_path)
    summarized = summary(config_path)
    exported >> deployed >> summarized
    deployed >> watcher()
    summarized >> report(config_path)


intentops_pipeline()
