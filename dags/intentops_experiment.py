"""
### intentops_experiment: train again on a run's curated data, with other settings

Training alone, on the curated split of a finished `intentops_pipeline` run: try another
learning rate, model size or search budget without running the Spark stages again.

- **source_run** (param): the pipeline run whose data to train on; empty: the newest run
  of the dataset with a label-QA output. The run's pointers up to label QA become this
  run's, so the train stage reads exactly that data; its config is the source run's saved
  config with this form's settings on top.
- **Priority**: experiments train at `training.priority` 0 unless the form sets
  `training_priority`; the pipeline trains at 1 by default (a production retrain at 100).
  The experiment waits for the `intentops_training` pool like any training, and when a
  pipeline training waits for that pool while an experiment holds it, the preemption
  controller (`python -m ops.preempt_controller`, started by `make up`) sends the
  experiment SIGTERM: it checkpoints, goes to `up_for_reschedule` (no retry used up) and
  resumes from the checkpoint when the slot frees.
- **Outputs**: the train stage's output (model, metrics, MLflow run under
  `training.experiment`, the search's trials when `training.search` is on), and the run's
  summary. Nothing is registered, exported or served: a model worth shipping comes from a
  pipeline run with the settings this experiment found.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from core import params as form
from core.runs import SOURCE_RUN
from core.stages import get
from ops.dag_tasks import python_stage


@dag(
    dag_id="intentops_experiment",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,  # they queue for the training pool; more is the pool's business
    default_args={"owner": "intentops", "retries": 1},
    tags=["intentops", "training"],
    params={SOURCE_RUN: Param("", type="string", title="source run",
                              description="the pipeline run whose curated data to train on "
                                          "(empty: the newest with a label-QA output)"),
            **{name: Param(**entry) for name, entry in form.form().items()}},
)
def intentops_experiment():
    @task(retries=0)
    def resolve_experiment(params: dict, run_id: str) -> str:
        """The experiment's config (the source run's, with this form's settings) and the
        source run's data pointers; a bad setting or no source run fails here."""
        from airflow.sdk.exceptions import AirflowFailException

        from core.runs import SettingsError, resolve_experiment_config

        try:
            path, note = resolve_experiment_config(run_id, dict(params))
        except SettingsError as exc:
            raise AirflowFailException(str(exc)) from None
        print(f"experiment: {note}")
        return path

    @task(trigger_rule="all_done")
    def summary(config_path: str, run_id: str) -> str:
        """The experiment's summary (its train stage; what it trained on)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from core.runs import write_summary

        if config_path is None:
            raise AirflowSkipException("the experiment's config was never resolved")
        return write_summary(config_path, run_id)

    config_path = resolve_experiment()
    trained = python_stage(get("train"), dag_id="intentops_experiment")(config_path)
    trained >> summary(config_path)


intentops_experiment()
