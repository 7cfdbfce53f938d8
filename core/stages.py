"""The pipeline's stages, declared once.

Each :class:`Stage` names its task id, the stages it reads from, the config sections it
reads, its work function (``module:function``, called as ``fn(cfg, run_id)`` and returning
a :class:`~core.stage.StageResult`), the verdict that may stop the run after it, and what
it publishes. The Airflow DAG's stage tasks, the CLI's stage commands, the run summary,
the training run's lineage tags and the run report all read :data:`STAGES`, in order.

Work functions are named by string and imported only when a stage runs: this module, like
the rest of ``core``, imports no stage, and reading the registry (``intentops stages
--json``, parsing the DAG) starts neither Spark nor torch.

A stage's code version is computed from the import closure of its work module
(:mod:`core.codeversion`), never from a hand-kept list of files.

Adding a stage: write ``run(cfg, run_id) -> StageResult`` (with ``core.stage.run_stage``
and ``code_version(<name>)``), optionally ``check(cfg, result) -> str`` raising
``core.stage.StageVerdict``, and add one ``Stage(...)`` below at its place in the order.
docs/ARCHITECTURE.md walks through an example.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core import codeversion

if TYPE_CHECKING:
    from core.config import PipelineConfig
    from core.stage import StageResult


@dataclass(frozen=True)
class Stage:
    name: str  # the task id, the lake folder, the CLI command
    upstream: tuple[str, ...]  # stages whose published output this one reads
    sections: tuple[str, ...]  # config sections it reads
    work: str  # "module:function", fn(cfg, run_id) -> StageResult
    outputs: tuple[str, ...]  # what its output folder holds
    summary: str  # one line, for --help, the DAG's docs and the report
    # "spark": a spark-submit job (jobs/spark/<name>.py, run through the spark_default
    # connection); "python": a Python task in the Airflow worker.
    kind: Literal["spark", "python"] = "python"
    # "module:function", fn(cfg, result) -> str: a one-line verdict for the log, or
    # StageVerdict raised when the published result must stop the run.
    check: str | None = None
    # Airflow task settings.
    retries: int = 2
    timeout_minutes: int = 45
    pool: str | None = None
    # Airflow's trigger rule: "all_done" runs the stage after an upstream verdict stopped the
    # run (the review push sends label QA's queue even when its gate failed).
    trigger_rule: str = "all_success"
    # Airflow priority_weight (the scheduler's order among waiting tasks; it never preempts).
    priority_weight: int = 1

    @property
    def module(self) -> str:
        return self.work.partition(":")[0]

    def code_version(self) -> str:
        return codeversion.code_version(self.module)

    def run(self, cfg: PipelineConfig, run_id: str) -> StageResult:
        return _resolve(self.work)(cfg, run_id)

    def verdict(self, cfg: PipelineConfig, result: StageResult) -> str:
        """A one-line verdict; raises StageVerdict when the result stops the run."""
        if self.check is None:
            return f"{self.name}: published {result.path}"
        return _resolve(self.check)(cfg, result)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "upstream": list(self.upstream), "sections": list(self.sections),
                "work": self.work, "check": self.check, "kind": self.kind,
                "outputs": list(self.outputs), "summary": self.summary, "trigger_rule": self.trigger_rule,
                "code_version": self.code_version(),
                "code_files": [str(p.relative_to(codeversion.PROJECT_ROOT))
                               for p in codeversion.code_files(self.module)]}


def _resolve(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


# Airflow pools per resource: created by `make demo` / `make up` (POOLS: name, slots, what).
SPARK_POOL, TRAINING_POOL, REGISTRY_POOL = "intentops_spark", "intentops_training", "intentops_registry"
TRAINING_NODES_POOL = "intentops_training_nodes"
POOLS: tuple[tuple[str, int, str], ...] = (
    (SPARK_POOL, 1, "Spark jobs (spark-submit slots)"),
    (TRAINING_POOL, 1, "training process groups (torchrun); preemptible by priority"),
    # One training group at a time holds TRAINING_POOL, so its nodes cannot deadlock with
    # another group's nodes: raise this to the nodes a multi-node training may add.
    (TRAINING_NODES_POOL, 1, "the extra nodes of a multi-node training (train_node tasks)"),
    (REGISTRY_POOL, 1, "model registry writes, one at a time"),
)


def airflow_setup_commands(folder: Path) -> list[list[str]]:
    """The ``airflow`` commands that prepare an Airflow home for the DAGs: the database,
    then every pool at once (``pools import`` of a file written into ``folder``; each
    ``airflow`` command costs about 4 s of start-up, one ``pools set`` per pool 15 s)."""
    import json

    path = folder / "intentops-pools.json"
    path.write_text(json.dumps({name: {"slots": slots, "description": what, "include_deferred": False}
                                for name, slots, what in POOLS}, indent=1))  # fmt: skip
    return [["db", "migrate"], ["pools", "import", str(path)]]

STAGES: tuple[Stage, ...] = (
    Stage("clean", (), ("input", "clean", "oos", "spark"), "jobs.spark.clean:run",
          ("kept/", "quarantine/"),
          "schema, Unicode NFKC, whitespace and control characters, length bounds, label "
          "normalization; rejects go to quarantine with a reason code", kind="spark",
          pool=SPARK_POOL),
    Stage("dedup", ("clean",), ("dedup", "spark"), "jobs.spark.dedup:run",
          ("kept/", "merged/", "clusters/"),
          "exact duplicates on the normalized key, then near-duplicates by MinHash LSH; one "
          "survivor per cluster, clusters with disagreeing labels flagged", kind="spark",
          pool=SPARK_POOL),
    Stage("desensitize", ("dedup",), ("desensitize", "spark"), "jobs.spark.desensitize:run",
          ("kept/", "merged/", "report.json"),
          "detects personal data and masks it with typed placeholders or keyed pseudonyms; "
          "nothing downstream sees raw PII", kind="spark", pool=SPARK_POOL),
    Stage("validate", ("clean", "dedup", "desensitize"), ("validation", "clean"), "quality.validate_stage:run",
          ("validation_result.json", "data_docs/"),
          "Great Expectations gate on the desensitized data: schema, nulls, label set, length, "
          "residual PII, duplicate rate, row accounting",
          check="quality.validate_stage:check", retries=1),
    Stage("labelqa", ("desensitize", "validate"), ("labelqa", "clean", "tracking"),
          "quality.labelqa_stage:run",
          ("curated/", "relabel_queue.csv", "relabel_queue.json", "label_studio_config.xml", "unlabeled.parquet",
           "qa_report.html", "metrics.json", "mlflow_run.json"),
          "annotator agreement, Dawid-Skene consensus, confident learning; the curated "
          "train/val/test split and the relabel queue",
          check="quality.labelqa_stage:check", retries=1),
    Stage("review", ("labelqa",), ("labeling",), "quality.review_stage:run", ("push.json", "sent.csv"),
          "sends the next round of the relabel queue to Label Studio, pre-labeled with the "
          "suggestion; skipped, saying why, when no Label Studio is configured",
          check="quality.review_stage:check", retries=2, timeout_minutes=20, trigger_rule="all_done"),
    Stage("train", ("clean", "dedup", "desensitize", "validate", "labelqa"), ("training", "clean", "oos", "tracking"), "training.task:run",
          ("model/", "metrics.json", "history.jsonl", "confusion_matrix.png",
           "classification_report.json", "config.json", "mlflow.json"),
          "torchrun process group fine-tuning the classifier on the curated split; "
          "checkpoints, a retry resumes; MLflow run with lineage tags; preemptible",
          pool=TRAINING_POOL, priority_weight=10),
    Stage("register", ("labelqa", "train"), ("training", "oos", "tracking"), "training.register_stage:run",
          ("behaviour.json", "decision.json"),
          "behavioural checks, then the registry gate: alias challenger only when the model "
          "beats the champion by the margin", check="training.register_stage:check",
          retries=2, pool=REGISTRY_POOL),
    Stage("export", ("labelqa", "register"), ("export", "training", "oos", "tracking"), "export.task:run",
          ("fp32/", "int8/", "report.md", "report.json"),
          "ONNX fp32 and int8 builds of the registered version, parity-checked, gated and "
          "timed, attached to the version", check="export.task:check", retries=1),
    Stage("deploy", ("labelqa", "export"), ("deploy", "training", "oos", "tracking"), "deploy.task:run",
          ("rollout.json", "rollout.png"),
          "canary rollout of the int8 build beside the stable model through the router; "
          "promote or roll back with the reason", check="deploy.task:check",
          retries=1, timeout_minutes=30),
)

NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
_BY_NAME = {s.name: s for s in STAGES}


def get(name: str) -> Stage:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no stage {name!r}; the stages are {', '.join(NAMES)}") from None


def code_version(name: str) -> str:
    """The code version stage ``name`` uses now (its import closure's hash)."""
    return get(name).code_version()


def ancestors(name: str) -> list[str]:
    """Every stage ``name`` depends on, directly or not, in pipeline order."""
    seen: set[str] = set()
    todo = list(get(name).upstream)
    while todo:
        s = todo.pop()
        if s not in seen:
            seen.add(s)
            todo.extend(get(s).upstream)
    return [n for n in NAMES if n in seen]


def through(last: str) -> tuple[Stage, ...]:
    """The stages in order up to and including ``last``."""
    return STAGES[: NAMES.index(get(last).name) + 1]


def _check_registry() -> None:
    """Registry invariants, checked at import: a wrong declaration fails at once."""
    errors = [f"{s.name}: upstream {up!r} is not an earlier stage"
              for i, s in enumerate(STAGES) for up in s.upstream if up not in NAMES[:i]]
    if len(set(NAMES)) != len(NAMES):
        errors.append("duplicate stage names")
    if errors:
        raise ValueError("; ".join(errors))


_check_registry()
