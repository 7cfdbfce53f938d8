"""Hyper-parameter search before training: an Optuna study inside the train task.

Each trial is a real training run (the same launcher as the final one: torchrun or one
process) into ``<folder>/trial-<n>/`` with the base hyper-parameters and the trial's choices,
``trial_epochs`` long. While it runs, its ``val_history.jsonl`` feeds ``trial.report`` after
every evaluation; when the median pruner says the trial trails the earlier ones, the trial
gets SIGTERM (it checkpoints and exits as preempted) and counts as pruned. The objective is
the best validation ``early_stopping_metric``. The budget is ``trials`` and
``timeout_seconds``, whichever ends first. The study lives in ``<folder>/study.db``
(SQLite), so a retried task continues it instead of starting over.

A space with no more combinations than trials is searched exhaustively (grid sampler, in
order); a larger one with TPE seeded by ``search.seed``. With an MLflow parent run given,
each trial is a nested run (tag ``mlflow.parentRunId``) holding its choices and score.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.config import SearchConfig, TrainingHParams

log = logging.getLogger("intentops.training.search")

Launcher = Callable[[Path, Path, str | None], list[str]]  # (out, config, mlflow run) -> argv


def _val_scores(out: Path, metric: str) -> dict[int, float]:
    scores: dict[int, float] = {}
    try:
        lines = (out / "val_history.jsonl").read_text().splitlines()
    except OSError:
        return scores
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        scores[int(row["epoch"])] = float(row[metric])
    return scores


def run_study(search: SearchConfig, base: TrainingHParams, launch: Launcher, folder: Path,
              env: Mapping[str, str], cwd: Path, tracking: Any = None) -> dict[str, Any]:
    """Run the study; the best trial's choices, its score and every trial's outcome.
    ``tracking``: an object with ``child(name, params) -> run_id`` and
    ``finish(run_id, metrics, status)`` (nested MLflow runs), or None."""
    import optuna

    folder.mkdir(parents=True, exist_ok=True)
    space = search.space()
    metric = base.early_stopping_metric
    combos = math.prod(len(v) for v in space.values())
    if combos <= search.trials:
        sampler: optuna.samplers.BaseSampler = optuna.samplers.GridSampler(space, seed=search.seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=search.seed)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
              if search.pruning else optuna.pruners.NopPruner())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="search", storage=f"sqlite:///{folder / 'study.db'}",
                                load_if_exists=True, direction="maximize", sampler=sampler,
                                pruner=pruner)
    epochs = search.trial_epochs or base.epochs

    def objective(trial: optuna.Trial) -> float:
        choices = {k: trial.suggest_categorical(k, v) for k, v in space.items()}
        out = folder / f"trial-{trial.number}"
        hp = base.model_copy(update={**choices, "epochs": epochs, "early_stopping_patience": None})
        config = folder / f"trial-{trial.number}.json"
        config.write_text(json.dumps(hp.model_dump()))
        run_id = tracking.child(f"trial-{trial.number}", choices) if tracking else None
        log.info("trial %d: %s", trial.number, choices)
        with open(folder / f"trial-{trial.number}.log", "w") as fh:
            proc = subprocess.Popen(launch(out, config, run_id), env=dict(env), cwd=cwd, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            reported: set[int] = set()
            pruned = False
            while True:
                running = proc.poll() is None
                for epoch, score in sorted(_val_scores(out, metric).items()):
                    if epoch in reported:
                        continue
                    reported.add(epoch)
                    trial.report(score, epoch)
                    if running and trial.should_prune():
                        proc.send_signal(signal.SIGTERM)  # checkpoints, exits as preempted
                        pruned = True
                        break
                if pruned or not running:
                    break
                time.sleep(0.2)
            proc.wait()
        scores = _val_scores(out, metric)
        best = max(scores.values()) if scores else float("nan")
        if tracking:
            tracking.finish(run_id, {f"best_val_{metric}": best}, "KILLED" if pruned else
                            "FINISHED" if proc.returncode == 0 else "FAILED")
        if pruned:
            raise optuna.TrialPruned(f"pruned after epoch {max(reported)}")
        if proc.returncode != 0 or not scores:
            raise RuntimeError(f"trial {trial.number} failed (exit {proc.returncode}); see "
                               f"{folder / f'trial-{trial.number}.log'}")
        return best

    done = sum(1 for t in study.trials if t.state.is_finished())
    left = search.trials - done
    if left > 0:
        study.optimize(objective, n_trials=left, timeout=search.timeout_seconds,
                       catch=(RuntimeError,))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise RuntimeError(f"hyper-parameter search: no trial completed; logs in {folder}")
    best = study.best_trial
    summary = {
        "best_params": dict(best.params), "best_value": best.value, "metric": f"val_{metric}",
        "trials": [{"number": t.number, "params": dict(t.params), "state": t.state.name,
                    "value": t.value} for t in study.trials],
        "budget": {"trials": search.trials, "timeout_seconds": search.timeout_seconds,
                   "trial_epochs": epochs}, "space": space,
        "sampler": type(sampler).__name__,
    }
    (folder / "search.json").write_text(json.dumps(summary, indent=2))
    log.info("search: best %s = %.4f with %s (%d trial(s))", f"val_{metric}", best.value,
             best.params, len(study.trials))
    return summary

