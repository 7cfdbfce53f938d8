"""The Airflow task wrappers the DAGs share: a Python stage as a task, and a stage's
exceptions as Airflow task outcomes (``dags/intentops_pipeline.py``,
``dags/intentops_experiment.py``). Imported by DAG files only (it imports the Airflow SDK)."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

from airflow.sdk import task

from core.stages import Stage


def python_stage(stage: Stage, dag_id: str = "intentops_pipeline"):
    """A stage run in the worker: its work function, then its verdict. A verdict that stops
    the run (a failed gate, a failed parity check, a rollback) is a property of the data or
    the model, not a transient error: AirflowFailException fails the task at once, after
    the stage published its outputs (reports, queues, charts) for people to read."""
    name = stage.name

    @task(task_id=name, doc_md=stage.summary, retries=stage.retries, trigger_rule=stage.trigger_rule,
          execution_timeout=timedelta(minutes=stage.timeout_minutes),
          priority_weight=stage.priority_weight,
          **({"pool": stage.pool} if stage.pool else {}))
    def run_stage(config_path: str, run_id: str) -> str:
        import os

        from airflow.sdk.exceptions import AirflowSkipException

        from core import stages
        from core.runs import load_run_config

        if config_path is None:
            # resolve_config was skipped (no new data) or failed: a stage that runs whatever
            # its upstreams did (review: all_done) has no run to work on.
            raise AirflowSkipException(f"{name}: no run config (resolve_config was skipped or failed)")
        # Who moves an alias (promotion, registration): recorded in the alias history.
        os.environ["INTENTOPS_ACTOR"] = f"airflow:{dag_id}/{run_id}"
        st = stages.get(name)
        cfg = load_run_config(config_path)
        if name == "deploy" and cfg.desensitize.mode == "pseudonym":
            # The model server masks requests with the key the training text was masked with.
            from airflow.sdk import Connection

            try:
                key = Connection.get("intentops_pseudonym").password
            except Exception:  # no such connection: the worker's environment may have the key
                key = None
            if key:
                os.environ[cfg.desensitize.key_env] = key
        with stage_outcomes(name, cfg.training.reschedule_seconds):
            result = st.run(cfg, run_id)
            print(f"{name}: output {result.path} ({'cache hit' if result.cache_hit else 'published'})")
            print(st.verdict(cfg, result))
        return result.path

    return run_stage


@contextmanager
def stage_outcomes(name: str, reschedule_seconds: float):
    """A stage's exceptions as Airflow task outcomes."""
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from core.stage import StageDeferred, StageSkipped, StageVerdict

    try:
        yield
    except StageVerdict as exc:
        raise AirflowFailException(str(exc)) from None
    except StageSkipped as exc:  # e.g. no Label Studio configured: skipped, with the reason
        raise AirflowSkipException(str(exc)) from None
    except StageDeferred as exc:
        # Preempted by a higher-priority training (the project's controller: the trainer
        # checkpointed) or outside the training window: up_for_reschedule frees the pool
        # slot without using up a retry.
        from datetime import UTC, datetime

        from airflow.sdk.exceptions import AirflowRescheduleException

        print(f"{name}: {exc}")
        raise AirflowRescheduleException(exc.until or datetime.now(UTC) + timedelta(
            seconds=reschedule_seconds)) from None
