"""
### intentops: raw customer messages to a curated training set

One DAG for the whole pipeline. Each task is an idempotent stage: it publishes its
output atomically under the lake (`lake_root` in `configs/pipeline.yaml`) with a manifest,
and a rerun with the same input and settings is a cache hit that does no work.

The stage tasks are the stages of `core/stages.py`, in its order (the table below is
generated from it), between `resolve_config` (the run's typed config, resolved once: YAML,
environment, then this run's params) and `summary` / `report` / `watcher`.

{stage_table}

**Params** (the trigger form) are derived from the typed config (`core/params.py`): each
is one config field, with its type, bounds and description; left empty it keeps the
configured value (`configs/pipeline.yaml`, `INTENTOPS__...` environment). An unknown
name or a bad value fails `resolve_config`, before any stage runs.
Paths relative to the project root are fine.

**Pseudonym mode** reads its HMAC key from the Airflow connection `intentops_pseudonym`
(the key is its password) or, without it, from the worker's `INTENTOPS_PSEUDONYM_KEY`.

**Schedule**: daily with a data interval (a run reads that day's partitions), or on the
monitoring DAG's assets (`intentops_drift_detected | intentops_new_labels`): an
asset-triggered run has no data interval and reads the latest export, all of
`input.path`; when no part of it is new (by content, against every published clean
output) it ends at `resolve_config` with every stage skipped, and its summary and report
say NO NEW DATA. Its summary starts with what started it (the events' extra).
With `max_active_runs=1`, events that arrive while a run is active queue one run.

**Trigger** from the UI's trigger form, or
`airflow dags trigger intentops_pipeline --conf '{"input_path": "exports/tickets.csv"}'`,
or `POST /api/v2/dags/intentops_pipeline/dagRuns` with `{"conf": {...}}`.

The Spark stages run through `spark-submit` against the `spark_default` connection:
`local[*]` by default, any Spark master (`spark://...`, `yarn`, `k8s://...`) by
configuration.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetOrTimeSchedule, Param, dag, task
from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

from core import assets
from core import params as form
from core.stages import STAGES, TRAINING_NODES_POOL, Stage
from ops.dag_tasks import python_stage, stage_outcomes

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


class StageSubmitOperator(SparkSubmitOperator):
    """spark-submit of one Spark stage, set up at run time from the run's resolved config:
    the driver memory is ``spark.driver_memory`` (the one setting; INTENTOPS__SPARK__DRIVER_MEMORY
    overrides it like any field), the JVM options ``spark.java_options``, and a stage that
    reads the ``desensitize`` section gets the pseudonymization key in its environment,
    from the Airflow connection `intentops_pseudonym` when it exists. The key never appears in the command line, in
    XCom or in rendered templates."""

    def __init__(self, *, stage_sections: tuple[str, ...] = (), **kwargs):
        super().__init__(**kwargs)
        self.stage_sections = stage_sections

    def execute(self, context):
        import os

        from airflow.sdk import Connection

        from core.runs import load_run_config

        args = list(self.application_args or [])
        cfg = load_run_config(args[args.index("--resolved-config") + 1])
        self._driver_memory = cfg.spark.driver_memory
        self.conf = {**(self.conf or {}), **cfg.spark.java_conf()}
        if "desensitize" in self.stage_sections:
            try:
                key = Connection.get("intentops_pseudonym").password
            except Exception:  # no such connection: the worker's environment may have the key
                key = None
            key = key or os.environ.get(cfg.desensitize.key_env)
            if cfg.desensitize.mode == "pseudonym":
                # A missing key is not fixed by retrying: fail at once, saying how to set it,
                # before spark-submit starts a JVM.
                from airflow.sdk.exceptions import AirflowFailException

                from core.errors import StageError
                from jobs.spark.desensitize import pseudonym_key

                try:
                    pseudonym_key(cfg.desensitize, key or "")
                except StageError as exc:
                    raise AirflowFailException(str(exc)) from None
            if key:
                self.env_vars = {**(self.env_vars or {}), cfg.desensitize.key_env: key}
        return super().execute(context)


def spark_stage(stage: Stage) -> StageSubmitOperator:
    import os

    return StageSubmitOperator(
        task_id=stage.name,
        doc_md=stage.summary,
        application=str(JOBS / f"{stage.name}.py"),
        conn_id="spark_default",
        name=f"intentops-{stage.name}",
        application_args=["--resolved-config", CONFIG_REF, "--run-id", "{{ run_id }}"],
        conf={"spark.ui.showConsoleProgress": "false"},
        # The Python that runs the job's driver and workers: the one with this project.
        env_vars={"PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", "python3")},
        stage_sections=stage.sections,
        retries=stage.retries,
        execution_timeout=timedelta(minutes=stage.timeout_minutes),
        priority_weight=stage.priority_weight,
        **({"pool": stage.pool} if stage.pool else {}),
    )


def train_nodes(train: Stage):
    """Nodes 1..MAX-1 of a multi-node training (``training.nnodes`` above 1 and no fixed
    ``training.rdzv_endpoint``): one mapped ``train_node`` task each, on the training
    queue beside the ``train`` task, whose launcher hosts the rendezvous they join. One
    node (the default): ``train_nodes`` and ``train_node`` are skipped."""

    @task(task_id="train_nodes", retries=1)
    def node_ranks(config_path: str) -> list[int]:
        from airflow.sdk.exceptions import AirflowSkipException

        from core.runs import load_run_config
        from training.task import dag_started_nodes

        if config_path is None:
            raise AirflowSkipException("no run config (resolve_config was skipped or failed)")
        cfg = load_run_config(config_path)
        nodes = dag_started_nodes(cfg)
        if not nodes:
            raise AirflowSkipException(f"training.nnodes {cfg.training.nnodes}: the train task's "
                                       "launcher is the only node the DAG starts")
        return nodes

    @task(task_id="train_node", retries=train.retries, pool=TRAINING_NODES_POOL,
          priority_weight=train.priority_weight, execution_timeout=timedelta(minutes=train.timeout_minutes),
          map_index_template="node {{ train_node_rank }}")
    def train_node(config_path: str, node: int, run_id: str) -> str:
        from airflow.sdk import get_current_context

        from core.runs import load_run_config

        get_current_context()["train_node_rank"] = node  # the map index's name in the grid
        from training.task import run_node

        cfg = load_run_config(config_path)
        with stage_outcomes(f"train_node {node}", cfg.training.reschedule_seconds):
            out = run_node(cfg, run_id, node)
        print(out)
        return out

    def build(config_path):
        ranks = node_ranks(config_path)
        return ranks, train_node.partial(config_path=config_path).expand(node=ranks)

    return build


def _stage_table() -> str:
    rows = ["| task | upstream | what it does |", "|---|---|---|"]
    rows += [f"| `{s.name}` | {', '.join(s.upstream) or '-'} | {s.kind}: {s.summary} |" for s in STAGES]
    return "\n".join(rows)


def _run_outcome(failed: bool):
    """A DAG-level callback: the run's outcome to the Pushgateway (the failed-run alert;
    the next good run clears it). Nothing happens without INTENTOPS_PUSHGATEWAY_URL."""
    def callback(context) -> None:
        from core import pushmetrics

        run = context.get("dag_run")
        pushmetrics.pipeline_run("intentops_pipeline", getattr(run, "run_id", "") or "", failed,
                                 str(context.get("reason") or "") if failed else "")
    return callback


@dag(
    dag_id="intentops_pipeline",
    doc_md=__doc__.replace("{stage_table}", _stage_table()),
    # Daily, with a real data interval (the day before the run): each scheduled run owns
    # one day of the export, which is what a backfill replays. Or on the monitoring DAG's
    # assets: drift or enough new labels start a run (no data interval: it reads the latest
    # export, or ends as "no new data"; see resolve_config).
    schedule=AssetOrTimeSchedule(
        timetable=CronDataIntervalTimetable("@daily", timezone="UTC"),
        assets=Asset(name=assets.DRIFT[0], uri=assets.DRIFT[1])
        | Asset(name=assets.NEW_LABELS[0], uri=assets.NEW_LABELS[1]),
    ),
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    # Stages publish under content-addressed keys; one run at a time keeps two runs from
    # racing for the same key's temp directory. It also coalesces asset events: while a
    # run is queued or running the scheduler creates no asset-triggered run; the events
    # wait in the asset queue (one row per asset) and the next run consumes them all.
    max_active_runs=1,
    default_args=default_args,
    dagrun_timeout=timedelta(hours=3),
    tags=["intentops", "data"],
    params={name: Param(**entry) for name, entry in form.form().items()},
    on_success_callback=_run_outcome(False),
    on_failure_callback=_run_outcome(True),
)
def intentops_pipeline():
    @task(retries=1)
    def resolve_config(params: dict, run_id: str, dag_run=None, data_interval_start=None,
                       data_interval_end=None, triggering_asset_events=None) -> str:
        """Resolve the config once for the run and save it; later tasks read the file.

        A bad or unknown param fails here, at once, before any stage runs. A scheduled or
        backfill run over a folder of date partitions reads only the days of its data
        interval; an interval with no partition skips the run (nothing to do is not a
        failure). An asset-triggered run (drift, new labels) reads the latest export; when
        no part of it is new it skips every stage, and its summary says NO NEW DATA."""
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        from core.runs import NoDataInInterval, NoNewData, SettingsError, resolve_run_config

        run_type = getattr(dag_run, "run_type", None)
        run_type = str(getattr(run_type, "value", run_type) or "")
        interval = ((data_interval_start, data_interval_end)
                    if run_type in ("scheduled", "backfill") else None)
        trigger = None
        if run_type == "asset_triggered":
            trigger = [{"asset": getattr(ev.asset, "name", None) or str(ev.asset), "extra": dict(ev.extra or {}),
                        "source_dag_id": ev.source_dag_id, "source_run_id": ev.source_run_id,
                        "timestamp": str(ev.timestamp)}
                       for events in (triggering_asset_events or {}).values() for ev in events]
        try:
            if trigger is None:
                path, note = resolve_run_config(run_id, dict(params), interval=interval)
            else:
                from ops.triggers import resolve_triggered_run

                path, note = resolve_triggered_run(run_id, dict(params), trigger)
        except SettingsError as exc:
            raise AirflowFailException(str(exc)) from None
        except (NoDataInInterval, NoNewData) as exc:
            raise AirflowSkipException(str(exc)) from None
        if note:
            print(f"{run_type} run: {note}")
        return path

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

    @task(trigger_rule="one_failed", retries=0)
    def watcher() -> None:
        """Fails the run when any stage failed (Airflow's watcher pattern)."""
        from airflow.sdk import get_current_context
        from airflow.sdk.exceptions import AirflowFailException

        from core import pushmetrics

        # Here as well as in the DAG's failure callback: this task runs in a worker for
        # certain (where the callback runs depends on the deployment).
        pushmetrics.pipeline_run("intentops_pipeline", get_current_context()["run_id"], True, "a stage")

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
            from core.config import load_config

            page = run_report.publish_no_new_data(load_config(), run_id)
            if page is not None:  # an asset-triggered run that found no new data says so
                print(f"run report: {page}: NO NEW DATA")
                return str(page)
            raise AirflowSkipException("the run's config was never resolved: no report")
        # Why stages published nothing (failed, upstream_failed) is known to Airflow only.
        states = (ti.get_task_states(dag_id=ti.dag_id, run_ids=[run_id]).get(run_id) or {}) if ti else {}
        path, uri = run_report.publish(config_path, run_id, {k: str(v) for k, v in states.items()})
        print(f"run report: {path}; in the Airflow UI: the run's 'Run report' tab "
              f"(/intentops/runs/<run_id>/report); MLflow artifact: {uri or 'none (no version registered)'}")
        return str(path)

    config_path = resolve_config()
    tasks = {}
    for s in STAGES:  # the registry's order; each stage waits for its declared upstream
        tasks[s.name] = spark_stage(s) if s.kind == "spark" else python_stage(s)(config_path)
        config_path >> tasks[s.name]
        for up in s.upstream:
            tasks[up] >> tasks[s.name]
    # Multi-node training: the other nodes start with the train task (same upstream).
    ranks, nodes = train_nodes(next(s for s in STAGES if s.name == "train"))(config_path)
    for up in next(s for s in STAGES if s.name == "train").upstream:
        tasks[up] >> ranks
    # Reviewed labels come back by polling (a webhook into Airflow's REST API would need a
    # token that expires): reschedule mode frees the worker slot between pokes. No new
    # review within labeling.pull_wait_minutes of the push skips it, saying so; the next
    # run pulls again. The 2 h timeout (soft fail) only bounds a misconfiguration.
    @task.sensor(task_id="review_pull", poke_interval=60, timeout=2 * 60 * 60, mode="reschedule",
                 soft_fail=True, retries=2)
    def review_pull(config_path: str, run_id: str):
        """Pulls finished Label Studio annotations into the lake's `reviewer` source; done
        when there is something new for the next label-QA run."""
        from airflow.sdk import PokeReturnValue
        from airflow.sdk.exceptions import AirflowSkipException

        from core.runs import load_run_config
        from core.stage import StageSkipped
        from quality import review_stage

        cfg = load_run_config(config_path)
        try:
            got = review_stage.pull(cfg)
        except StageSkipped as exc:
            raise AirflowSkipException(str(exc)) from None
        print(f"review_pull: {got}")
        fresh = got["new_annotations"] + got["edited_annotations"]
        if not fresh and review_stage.waited_enough(cfg, run_id):
            raise AirflowSkipException(
                f"no new reviews within labeling.pull_wait_minutes={cfg.labeling.pull_wait_minutes} of "
                "the push; the next run's pull (or `intentops review-pull`) brings them in")
        return PokeReturnValue(is_done=fresh > 0, xcom_value=got if fresh else None)

    tasks["review"] >> review_pull(config_path)
    last = tasks[STAGES[-1].name]
    summarized = summary(config_path)
    last >> summarized
    last >> watcher()
    summarized >> report(config_path)


intentops_pipeline()
