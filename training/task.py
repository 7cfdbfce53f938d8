"""The training stage as the DAG runs it (registration is ``training.register_stage``).

``run``: resolves the curated split of the run's label-QA output, creates (or finds
again, by the stage key) the MLflow run with the lineage tags, and launches
``torchrun ... -m training.train`` as a real process group. Checkpoints live in a work
folder keyed like the stage (``<lake>/train/.work-<key>``) that survives failed attempts,
so a ``torchrun --max-restarts`` restart or an Airflow retry resumes instead of starting
over. When the group finishes, the model is logged to the run (pyfunc, with signature
and input example) and the outputs are published as the stage's output.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core import runs, stage, stages, timewindow, tracking
from core.config import PROJECT_ROOT, PipelineConfig
from training import preempt

log = logging.getLogger(__name__)
TRAIN = "train"


def _lineage(cfg: PipelineConfig, run_id: str) -> dict[str, str]:
    """Tags pointing back to every upstream stage output and the data-quality record."""
    tags = {"intentops.pipeline_run_id": run_id}
    for name in stages.ancestors(TRAIN):
        with contextlib.suppress(stage.StageError):
            tags[f"intentops.data.{name}_key"] = stage.upstream(cfg.lake, run_id, name).manifest["key"]
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    tags["intentops.data_quality_run_id"] = str(qa.manifest["stats"].get("mlflow_run_id"))
    fp = stage.file_fingerprint(Path(qa.path) / "curated")
    tags["intentops.data.curated_fingerprint"] = json.dumps(fp, sort_keys=True)[:5000]
    return tags


@dataclass(frozen=True)
class LaunchPlan:
    """What the train task publishes (``<work>/launch.json``) when the DAG starts the other
    nodes of a multi-node training: the rendezvous it hosts and the MLflow run whichever
    rank 0 logs to. A new plan (a retry of the train task) has a new token; a node task
    that lost its group joins the next plan."""

    token: str
    endpoint: str  # host:port of the c10d store, hosted by the train task's launcher
    rdzv_id: str
    mlflow_run_id: str
    config: str  # the hparams file every node trains with

    @classmethod
    def read(cls, work_dir: Path) -> LaunchPlan | None:
        try:
            return cls(**json.loads((work_dir / LAUNCH_PLAN).read_text()))
        except (OSError, ValueError, TypeError):
            return None


LAUNCH_PLAN = "launch.json"


def node_addr() -> str:
    """The address other nodes reach this worker at (``INTENTOPS_NODE_ADDR``, set per
    worker where host names do not resolve; the cluster shape sets 127.0.0.1)."""
    return os.environ.get("INTENTOPS_NODE_ADDR") or socket.gethostname()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host in ("127.0.0.1", "localhost", "::1") else "", 0))
        return int(s.getsockname()[1])


def dag_started_nodes(cfg: PipelineConfig) -> list[int]:
    """Node ranks 1..MAX-1 the DAG starts as ``train_node`` tasks (none for one node, or
    when ``training.rdzv_endpoint`` names a rendezvous whose launchers someone else starts)."""
    lo, hi = cfg.training.nnodes_range
    return list(range(1, hi)) if hi > 1 and not cfg.training.rdzv_endpoint else []


def torchrun_command(cfg: PipelineConfig, curated: Path, labels: Path, out: Path, config: Path,
                     mlflow_run_id: str | None, plan: LaunchPlan | None = None,
                     host: bool = True) -> list[str]:
    """The launcher's command. With more than one node: the fixed ``training.rdzv_endpoint``,
    or ``plan``'s rendezvous (the DAG-started nodes; ``host``: this launcher holds the store)."""
    t = cfg.training
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nnodes", str(t.nnodes),
           "--nproc-per-node", str(t.nproc_per_node), "--max-restarts", str(t.max_restarts)]
    if t.nnodes_range[1] > 1 and plan is not None:
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", plan.endpoint, "--rdzv-id", plan.rdzv_id,
                "--rdzv-conf", f"is_host={str(host).lower()},join_timeout={t.rdzv_join_timeout_seconds:g}"]
    elif t.nnodes_range[1] > 1:
        if not t.rdzv_endpoint:
            raise stage.StageError("training.nnodes > 1 needs training.rdzv_endpoint (host:port), "
                                   "or the DAG's train_node tasks (a LaunchPlan)")
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", t.rdzv_endpoint]
    else:
        cmd += ["--standalone"]
    return cmd + ["-m", "training.train", "--curated", str(curated), "--labels", str(labels),
                  "--out", str(out), "--config", str(config),
                  *(["--mlflow-run-id", mlflow_run_id] if mlflow_run_id else [])]


# What the logged model's code imports when MLflow loads it (training.predictor with the
# contract's preprocessing), as distributions; pinned to this environment's versions by
# ``model_requirements``. Declared rather than inferred: MLflow's inference loads the model
# in a subprocess (8.6 s per logged model against 0.5 s, benchmarks/model_logging.py) and
# found neither torch nor tokenizers (it listed this project's own, unpublished,
# distribution instead).
MODEL_DISTRIBUTIONS = ("mlflow", "cloudpickle", "torch", "transformers", "tokenizers", "numpy",
                       "pandas", "pydantic", "pyyaml", "phonenumbers", "pyahocorasick", "names")


def model_requirements() -> list[str]:
    """``MODEL_DISTRIBUTIONS`` pinned to the installed versions (one not installed is left out)."""
    from importlib import metadata

    pins = []
    for dist in MODEL_DISTRIBUTIONS:
        try:
            # without a local label ("2.13.0+cpu"): "==2.13.0" matches that build and PyPI's
            pins.append(f"{dist}=={metadata.version(dist).split('+')[0]}")
        except metadata.PackageNotFoundError:
            continue
    return pins


def _log_model(cfg: PipelineConfig, mlflow_run_id: str, model_dir: Path) -> str:
    """Log the model to its training run as a pyfunc (once: found again by a run tag)."""
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature

    from training.predictor import IntentClassifierModel, Predictor

    client = tracking.mlflow_client(cfg)
    existing = client.get_run(mlflow_run_id).data.tags.get("intentops.model_uri")
    if existing:
        return existing
    mlflow.set_tracking_uri(tracking.tracking_uri(cfg))
    # The fluent API refuses a run of another experiment than the process's active one (an
    # earlier stage in the same process, `intentops run` or export, may have set it).
    mlflow.set_experiment(experiment_id=client.get_run(mlflow_run_id).info.experiment_id)
    example = pd.DataFrame({"text": ["I still have not received my new card", "How do I change my PIN?"]})
    labels, scores = Predictor(model_dir).predict(example.text.tolist())
    signature = infer_signature(example, pd.DataFrame({"label": labels, "score": scores,
                                                       "oos": [False] * len(labels)}))
    with mlflow.start_run(run_id=mlflow_run_id):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=IntentClassifierModel(),
            artifacts={"model_dir": str(model_dir)},
            signature=signature,
            input_example=example,
            pip_requirements=model_requirements(),
            # the model code, and its contract's preprocessing (normalization, PII detector)
            code_paths=[str(PROJECT_ROOT / p) for p in ("training", "contract", "pii", "textnorm", "core")],
        )
    client.set_tag(mlflow_run_id, "intentops.model_uri", info.model_uri)
    return info.model_uri


def refuse_label_change(cfg: PipelineConfig, labels: list[str]) -> None:
    """Raise ``StageVerdict`` when ``labels`` differ from the label set of the registered
    model's ``champion``: such a model could never be registered (``training.registry``),
    so the run stops before it spends any training time."""
    from training import registry

    name = cfg.training.registered_model
    change = registry.champion_label_change(tracking.mlflow_client(cfg), name, labels,
                                            tracking.tracking_uri(cfg))
    if change is None:
        return
    raise stage.StageVerdict(
        f"training refused: this run's label set differs from that of champion "
        f"v{change.champion_version} of the registered model {name!r}: {change.description}. "
        "A registered model keeps one label set (metrics over different sets do not compare, "
        "and serving clients expect the champion's classes). To proceed, either give this "
        f"dataset its own name (config key `dataset`, now {cfg.dataset!r}: the model is then "
        "registered as intentops-<dataset>, unless training.registered_model is set), or "
        f"retire the old model first (remove the champion alias of {name!r}, or delete that "
        "registered model, in MLflow)")


def preflight(cfg: PipelineConfig, labels: list[str]) -> None:
    """What would refuse this model at registration, checked before training: a label set
    other than the champion's, and probes (``training.probes_file``) outside the label set."""
    from training import behaviour

    refuse_label_change(cfg, labels)
    from training.contract import oos_label

    if (label := oos_label(cfg.oos)) is not None and label not in labels:
        raise stage.StageError(
            f"oos.label {cfg.oos.label!r} never occurs in this run's data: the label set has "
            f"{len(labels)} labels ({', '.join(labels[:8])}{', ...' if len(labels) > 8 else ''}); "
            "name the label your export gives out-of-scope messages, or leave oos.label empty")
    if cfg.training.probes_file.strip():
        probes = behaviour.load_probes(cfg.resolve_path(cfg.training.probes_file))
        behaviour.check_probe_labels(probes, labels, cfg.training.probes_file)


def _attach_contract(cfg: PipelineConfig, run_id: str, qa: stage.StageResult, model_dir: Path,
                     mlflow_run_id: str) -> dict[str, Any]:
    """The model's serving contract (``training.contract``): the masking the desensitize
    stage applied, and the reject rule calibrated on val; its figures go to the MLflow run."""
    from contract import preprocess
    from training import contract
    from training.data import load_curated

    desens = stage.upstream(cfg.lake, run_id, "desensitize").manifest
    text_spec = preprocess.spec(desens["stats"]["mode"], desens["config"].get("key_id"))
    splits = load_curated(Path(qa.path) / "curated", runs.run_labels(cfg.lake, run_id))
    try:
        figures = contract.attach(model_dir, splits, cfg.oos, text_spec)
    except ValueError as exc:
        raise stage.StageError(str(exc)) from exc
    client = tracking.mlflow_client(cfg)
    for k, v in figures.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            client.log_metric(mlflow_run_id, k, float(v))
    client.set_tag(mlflow_run_id, "intentops.reject_rule", figures["reject_note"][:5000])
    log.info("reject rule: %s", figures["reject_note"])
    return figures


class _NestedRuns:
    """Each search trial as an MLflow run nested under the training run."""

    def __init__(self, cfg: PipelineConfig, parent: str) -> None:
        self.client, self.parent = tracking.mlflow_client(cfg), parent
        self.exp = self.client.get_run(parent).info.experiment_id

    def child(self, name: str, params: dict[str, Any]) -> str:
        run = self.client.create_run(self.exp, run_name=name,
                                     tags={"mlflow.parentRunId": self.parent})
        for k, v in params.items():
            self.client.log_param(run.info.run_id, k, v)
        return run.info.run_id

    def finish(self, run_id: str, metrics: dict[str, float], status: str) -> None:
        for k, v in metrics.items():
            if v == v:  # not NaN
                self.client.log_metric(run_id, k, v)
        self.client.set_terminated(run_id, status)


def _search(cfg: PipelineConfig, hp: Any, curated: Path, labels: Path, folder: Path,
            env: dict[str, str], rid: str) -> dict[str, Any]:
    """The Optuna study (training/search.py) with the stage's own launcher; its best
    choices are logged on the training run."""
    from training.search import run_study

    # Trials run on this node alone: the DAG's other nodes join the final training only.
    one_node = cfg.model_copy(update={"training": cfg.training.model_copy(update={"nnodes": 1})})

    def launch(out: Path, config: Path, run_id: str | None) -> list[str]:
        return torchrun_command(one_node, curated, labels, out, config, run_id)

    summary = run_study(cfg.training.search, hp, launch, folder, env, PROJECT_ROOT,
                        _NestedRuns(cfg, rid))
    client = tracking.mlflow_client(cfg)
    client.set_tag(rid, "intentops.search.best_params", json.dumps(summary["best_params"]))
    client.set_tag(rid, "intentops.search.best_value", str(summary["best_value"]))
    client.set_tag(rid, "intentops.search.trials", str(len(summary["trials"])))
    return summary


def _die_with_parent() -> None:
    """In the launcher's child before exec: SIGTERM it when the task process dies (a worker
    SIGKILLed, an OOM kill). The trainer takes SIGTERM as a preemption: it checkpoints, and
    the retry resumes from there instead of racing an orphaned launcher for the work folder."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _wait_unless_orphaned(proc: subprocess.Popen, poll: float = 2.0, grace: float = 120.0) -> bool:
    """Wait for the launcher, unless this process loses its parent first: Airflow runs a
    task in a process group of its own under a supervisor, so a worker killed with its
    group leaves the task running on as an orphan while the scheduler retries it elsewhere.
    Then the launcher gets SIGTERM (the group checkpoints, as on a preemption; SIGKILL
    after ``grace``), so the retry resumes alone. True when that happened."""
    parent = os.getppid()
    while True:
        try:
            proc.wait(timeout=poll)
            return False
        except subprocess.TimeoutExpired:
            if os.getppid() == parent:
                continue
        log.warning("the task's parent (pid %d) is gone: stopping the launcher with a checkpoint", parent)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return True


def launch_preemptible(cmd: list[str], env: dict[str, str], lake: Path, run_id: str,
                       priority: int, work_dir: Path, lease: bool = True, grace: float = 120.0) -> str:
    """Run the trainer's launcher to the end under a lease (whom the preemption controller
    signals, at what priority); its output. A run that exits as preempted (the trainer's
    ``preempted`` marker) raises ``StagePreempted``, any other failure ``StageError``.
    ``lease=False``: a DAG-started node of someone else's training (its train task holds
    the lease; a preemption of that group stops this node too)."""
    log.info("launching: %s", " ".join(cmd))
    if lease:
        (work_dir / "preempted").unlink(missing_ok=True)
        (work_dir / preempt.REQUESTED).unlink(missing_ok=True)
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(cmd, env=env, cwd=PROJECT_ROOT, stdout=output,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=_die_with_parent)
        held = (preempt.write_lease(lake, preempt.Lease(run_id, priority, proc.pid, time.time(),
                                                        str(work_dir))) if lease else None)
        try:
            orphaned = _wait_unless_orphaned(proc, grace=grace)
        finally:
            if proc.poll() is None:  # the task itself is being killed: take torchrun along
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
            if held is not None:
                held.unlink(missing_ok=True)
        output.seek(0)
        text = output.read()
    sys.stdout.write(text[-20000:])
    if orphaned:
        raise stage.StageError(
            "this task's supervisor died (its worker was lost): the training was stopped with a "
            "checkpoint, which the task's retry resumes from")
    if proc.returncode != 0 and (work_dir / "preempted").exists():
        info = json.loads((work_dir / "preempted").read_text())
        raise stage.StagePreempted(
            f"preempted at step {info.get('step')} (checkpointed); resumes from it when "
            "rescheduled")
    if proc.returncode != 0 and (work_dir / preempt.REQUESTED).exists():
        raise stage.StagePreempted(
            "preempted without a checkpoint at the signal (the group was still starting, or "
            "was killed after the grace); resumes from its last checkpoint, if any, when rescheduled")
    if proc.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise stage.StageError(f"torchrun exited with {proc.returncode}; last lines:\n{tail}")
    return text


def window_check(window: str, now: dt.datetime | None = None) -> None:
    """Outside the training window: StageDeferred until its opening."""
    now = now or dt.datetime.now().astimezone()
    if not timewindow.inside(window, now):
        until = timewindow.next_start(window, now)
        raise stage.StageDeferred(f"outside the training window {window}: rescheduled to "
                                  f"{until.isoformat(timespec='minutes')}", until)


def _identity(cfg: PipelineConfig, run_id: str) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    """The stage's inputs, config, code version and key (the train task and its nodes)."""
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    t = cfg.training
    labels_file = runs.run_labels_file(cfg.lake, run_id)  # the label set clean published
    inputs = {"labelqa": {"key": qa.manifest["key"]}}
    stage_cfg = {"hparams": t.hparams.model_dump(), "nproc_per_node": t.nproc_per_node, "nnodes": t.nnodes,
                 **({"search": t.search.model_dump()} if t.search.enabled else {}),
                 "labels": Path(labels_file).read_text(),
                 "oos": cfg.oos.model_dump(exclude={"max_recall_drop"})}
    code = stages.code_version(TRAIN)
    return inputs, stage_cfg, code, stage.stage_key(TRAIN, inputs, stage_cfg, code)


def _train_env(cfg: PipelineConfig) -> dict[str, str]:
    return dict(os.environ, MLFLOW_TRACKING_URI=tracking.tracking_uri(cfg),
                PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))


def run(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    hp = cfg.training.hparams  # validated with the config, before any stage ran
    labels_file = runs.run_labels_file(cfg.lake, run_id)  # the label set clean published
    # Before the MLflow run and torchrun: refuse what registration would refuse anyway.
    preflight(cfg, runs.run_labels(cfg.lake, run_id))
    window_check(cfg.training.window)
    t = cfg.training
    inputs, stage_cfg, code, key = _identity(cfg, run_id)
    work_dir = cfg.lake / TRAIN / f".work-{key}"

    def work(out: Path) -> dict[str, Any]:
        work_dir.mkdir(parents=True, exist_ok=True)
        rid = tracking.find_or_create_run(cfg, t.experiment, key, f"train-{stage.safe_run_id(run_id)}",
                                          _lineage(cfg, run_id))
        env = _train_env(cfg)
        hparams, searched = hp, None
        if t.search.enabled:
            searched = _search(cfg, hp, Path(qa.path) / "curated", Path(labels_file),
                               work_dir / "search", env, rid)
            hparams = hp.model_copy(update=searched["best_params"])
        config_file = work_dir / "hparams.json"
        config_file.write_text(json.dumps(hparams.model_dump(), indent=2))
        done = (work_dir / "done").exists()  # trained by an attempt whose logging then failed
        plan = None
        (work_dir / "preempted").unlink(missing_ok=True)  # before a node can read the plan
        if not done and dag_started_nodes(cfg):  # this launcher hosts the nodes' rendezvous
            addr = node_addr()
            token = uuid.uuid4().hex[:12]
            plan = LaunchPlan(token, f"{addr}:{_free_port(addr)}", f"{key[:16]}-{token}", rid, str(config_file))
            stage.atomic_write_text(work_dir / LAUNCH_PLAN, json.dumps(asdict(plan)))
        if not done:
            cmd = torchrun_command(cfg, Path(qa.path) / "curated", Path(labels_file), work_dir,
                                   config_file, rid, plan)
            try:
                launch_preemptible(cmd, env, cfg.lake, run_id, t.priority, work_dir,
                                   grace=t.preempt_grace_seconds)
            finally:
                if plan is not None and LaunchPlan.read(work_dir) == plan:
                    (work_dir / LAUNCH_PLAN).unlink(missing_ok=True)
        figures = _attach_contract(cfg, run_id, qa, work_dir / "model", rid)
        model_uri = _log_model(cfg, rid, work_dir / "model")
        for name in ("model", "metrics.json", "history.jsonl", "confusion_matrix.png",
                     "classification_report.json", "config.json"):
            src = work_dir / name
            if src.is_dir():
                shutil.copytree(src, out / name)
            elif src.exists():
                shutil.copy2(src, out / name)
        m = json.loads((work_dir / "metrics.json").read_text())
        (out / "mlflow.json").write_text(json.dumps({"run_id": rid, "model_uri": model_uri}))
        return {
            "rows_in": None,
            "kept": None,
            "test_rows": m.get("test_rows"),
            "test_accuracy": m.get("test_accuracy"),
            "test_macro_f1": m.get("test_macro_f1"),
            "steps": m.get("steps"),
            "train_samples_per_s": m.get("train_samples_per_s"),
            "world_size": m.get("world_size"),
            **figures,
            "mlflow_run_id": rid,
            "model_uri": model_uri,
            # the search's outcome: what trained the model and how it was chosen (lineage)
            **({"search": {k: searched[k] for k in ("best_params", "best_value", "metric",
                                                    "budget", "space", "trials")}}
               if searched else {}),
        }

    result = stage.run_stage(TRAIN, cfg.lake, inputs, stage_cfg, code, work, run_id)
    if not result.cache_hit:
        shutil.rmtree(work_dir, ignore_errors=True)  # published: checkpoints no longer needed
    return result


def run_node(cfg: PipelineConfig, run_id: str, node: int, poll: float = 2.0) -> str:
    """Node ``node`` of a multi-node training the DAG started (the ``train_node`` task; the
    train task is node 0 and hosts the rendezvous). It waits for the train task's
    ``LaunchPlan``, runs a launcher that joins it, and ends when the group finishes: the
    train task (or whichever rank 0) logs and publishes. A group that fails without a
    preemption is joined again when the train task's retry publishes a new plan (within
    ``training.node_wait_seconds``); a preemption reschedules this task as it does the
    train task. The work folder must be shared between the nodes (the lake is)."""
    t = cfg.training
    if node not in dag_started_nodes(cfg):
        raise stage.StageSkipped(f"train_node {node}: this run trains on {t.nnodes} node(s)"
                                 + (f" with the rendezvous {t.rdzv_endpoint} started outside the DAG"
                                    if t.rdzv_endpoint else ""))
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    _, _, _, key = _identity(cfg, run_id)
    published = cfg.lake / TRAIN / key / stage.MANIFEST
    work_dir = cfg.lake / TRAIN / f".work-{key}"
    env = _train_env(cfg)
    joined: str | None = None
    # The train task runs its search (if any) before it publishes the plan.
    wait = t.node_wait_seconds + (t.search.timeout_seconds if t.search.enabled else 0.0)
    deadline = time.monotonic() + wait
    while True:
        if published.exists():
            return f"train_node {node}: the training {key[:12]} is published" + (
                "" if joined else " (nothing left to join)")
        plan = LaunchPlan.read(work_dir)
        if plan is None or plan.token == joined:
            if time.monotonic() > deadline:
                raise stage.StageError(
                    f"train_node {node}: no launch plan from the train task within {wait:g} s "
                    f"(training.node_wait_seconds, plus the search's time budget)")
            time.sleep(poll)
            continue
        cmd = torchrun_command(cfg, Path(qa.path) / "curated", runs.run_labels_file(cfg.lake, run_id),
                               work_dir, Path(plan.config), plan.mlflow_run_id, plan, host=False)
        joined = plan.token
        try:
            launch_preemptible(cmd, env, cfg.lake, f"{run_id}#node{node}", t.priority, work_dir, lease=False,
                               grace=t.preempt_grace_seconds)
            return f"train_node {node}: trained in the group {plan.rdzv_id}"
        except stage.StagePreempted:
            raise
        except stage.StageError as exc:
            log.warning("train_node %s: the group %s ended without this node: %s", node, plan.rdzv_id,
                        str(exc).splitlines()[0])
            deadline = time.monotonic() + wait  # for the retry's plan


def check(cfg: PipelineConfig, result: stage.StageResult) -> str:
    s = result.manifest["stats"]
    oos = ""
    if s.get("test_in_scope_accuracy") is not None:
        oos = f", in-scope accuracy {s['test_in_scope_accuracy']:.4f} with the reject rule"
    if s.get("test_oos_recall") is not None:
        oos += f", out-of-scope recall {s['test_oos_recall']:.4f}"
        if s.get("test_oos_precision") is not None:
            oos += f" (precision {s['test_oos_precision']:.4f})"
    return (f"test accuracy {s.get('test_accuracy')}{oos}; {s.get('reject_note', 'no reject rule')}; "
            f"MLflow run {s.get('mlflow_run_id')}, model {s.get('model_uri')}")
