"""Benchmark: training that shares (issue 29) on the small encoder and a tiny Banking77 set.

- gradient compression: all-reduce payload per step and median step time with each
  communication hook (none, fp16, powersgd rank 2) on 2 gloo processes, and the test
  accuracy each reaches;
- data prefetch: median step time with and without DataLoader workers (1 process);
- preemption: time from the SIGTERM to the launcher's exit (resources freed: the
  checkpoint is written by then) and the training time lost to it (both attempts' wall
  time minus an uninterrupted run's);
- search: best validation score against the budget (trials), one grid study over 4 lrs.

Every run is a real process (torchrun for 2 processes), the tests' helpers build the data.

    .venv/bin/python benchmarks/training_sharing.py [--out benchmarks/results/training_sharing.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_training import CLASSES, make_curated, train_cmd, write_config  # noqa: E402

ENV = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")} | {"PYTHONPATH": str(ROOT)}


def history(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]


def metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def train(cmd: list[str]) -> float:
    t0 = time.monotonic()
    res = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-3000:])
    return time.monotonic() - t0


def compression(tmp: Path, curated: Path, labels: Path) -> list[dict]:
    rows = []
    for hook in ("none", "fp16", "powersgd"):
        cfg = write_config(tmp / f"c-{hook}.json", epochs=3, batch_size=8, lr=2e-3, num_threads=1,
                           comm_hook=hook, powersgd_rank=2, powersgd_start_iter=3)
        out = tmp / f"c-{hook}"
        wall = train(train_cmd(curated, labels, out, cfg, nproc=2))
        h, m = history(out), metrics(out)
        steady = h[5:]  # after PowerSGD's warm-up and the first steps' allocations
        rows.append({"hook": hook, "comm_bytes_per_step_median": statistics.median(x["comm_bytes"] for x in steady),
                     "comm_bytes_total": m["comm_bytes"], "step_seconds_median":
                     statistics.median(x["step_seconds"] for x in steady), "steps": m["steps"],
                     "test_accuracy": m["test_accuracy"], "wall_seconds": round(wall, 1)})
        print(rows[-1], flush=True)
    return rows


def prefetch(tmp: Path, curated: Path, labels: Path) -> list[dict]:
    rows = []
    for workers in (0, 2):
        extra = {"num_workers": workers, "persistent_workers": True} if workers else {}
        cfg = write_config(tmp / f"p-{workers}.json", epochs=3, batch_size=16, num_threads=1, **extra)
        out = tmp / f"p-{workers}"
        wall = train(train_cmd(curated, labels, out, cfg, nproc=1))
        h = history(out)[3:]
        rows.append({"num_workers": workers, "step_seconds_median": statistics.median(x["step_seconds"] for x in h),
                     "train_samples_per_s": metrics(out)["train_samples_per_s"], "wall_seconds": round(wall, 1)})
        print(rows[-1], flush=True)
    return rows


def preemption(tmp: Path, curated: Path, labels: Path) -> dict:
    cfg = write_config(tmp / "pre.json", epochs=4, batch_size=8, num_threads=1, checkpoint_every_steps=1000)
    ref_wall = train(train_cmd(curated, labels, tmp / "pre-ref", cfg, nproc=2))
    out = tmp / "pre"
    cmd = train_cmd(curated, labels, out, cfg, nproc=2)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    while proc.poll() is None:
        lines = (out / "history.jsonl").read_text().splitlines() if (out / "history.jsonl").exists() else []
        if len(lines) >= 30:  # mid-way through the second epoch
            break
        time.sleep(0.02)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    freed = time.monotonic() - signalled
    first_wall = time.monotonic() - t0
    marker = json.loads((out / "preempted").read_text())
    second_wall = train(cmd)
    return {"signal_to_launcher_exit_seconds": round(freed, 2),
            "signal_to_checkpointed_exit_seconds_trainer": marker["signal_to_exit_seconds"],
            "preempted_at_step": marker["step"], "steps": metrics(out)["steps"],
            "uninterrupted_wall_seconds": round(ref_wall, 1),
            "preempted_attempt_wall_seconds": round(first_wall, 1),
            "resumed_attempt_wall_seconds": round(second_wall, 1),
            "training_time_lost_seconds": round(first_wall + second_wall - ref_wall, 1)}


def search(tmp: Path, curated: Path, labels: Path) -> list[dict]:
    from test_training import SMALL

    from core.config import SearchConfig
    from training.search import run_study
    from training.train import TrainConfig

    lrs = [1e-5, 1e-4, 1e-3, 3e-3]
    cfg = SearchConfig(enabled=True, trials=len(lrs), trial_epochs=2, lr=lrs, pruning=False, seed=0)

    def launch(out: Path, config: Path, run_id: str | None) -> list[str]:
        return train_cmd(curated, labels, out, config, nproc=1)

    t0 = time.monotonic()
    summary = run_study(cfg, TrainConfig(**SMALL, num_threads=2), launch, tmp / "search", ENV, ROOT)
    wall = time.monotonic() - t0
    rows, best = [], float("-inf")
    for t in sorted(summary["trials"], key=lambda t: t["number"]):
        best = max(best, t["value"] if t["value"] is not None else float("-inf"))
        rows.append({"trials": t["number"] + 1, "lr": t["params"]["lr"], "trial_value": t["value"],
                     "best_so_far": best})
    print(rows, flush=True)
    return [*rows, {"study_wall_seconds": round(wall, 1), "metric": summary["metric"]}]


def elastic(tmp: Path, curated: Path, labels: Path) -> dict:
    """Two launchers (--nnodes 1:2, c10d on this host, 1 process each); the one without the
    rendezvous store is SIGKILLed after 30 steps. Recovery: from the kill to the survivor's
    first optimizer step after its resume, and the whole job's wall time against an
    uninterrupted 2-launcher run."""
    import re
    import socket

    from training import checkpoint as ckpt

    cfg = write_config(tmp / "el.json", epochs=3, batch_size=8, num_threads=1, checkpoint_every_steps=5)

    def go(out: Path, kill: bool) -> dict:
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        cmds = [[str(Path(sys.executable).parent / "torchrun"), "--nnodes", "1:2", "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", out.name,
                 "--rdzv-conf", f"is_host={h}", "--max-restarts", "3", "--monitor-interval", "1",
                 "-m", "training.train", "--curated", str(curated), "--labels", str(labels), "--out", str(out),
                 "--config", str(cfg)] for h in (1, 0)]
        log = tmp / f"{out.name}.log"
        t0 = time.monotonic()
        with log.open("w") as fh:
            host = subprocess.Popen(cmds[0], env=ENV, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            other = subprocess.Popen(cmds[1], env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
            res: dict = {}
            if kill:
                while len(history(out)) < 30 if (out / "history.jsonl").exists() else True:
                    time.sleep(0.02)
                killed_at_step = max(s for s, _ in ckpt.step_checkpoints(out / "checkpoints"))
                os.killpg(other.pid, signal.SIGKILL)
                t_kill = time.monotonic()
                while True:
                    m = re.search(r"resuming from checkpoint step-\d+\.pt: step (\d+)", log.read_text())
                    if m and any(h["step"] > int(m[1]) for h in history(out)):
                        break
                    assert host.poll() is None, log.read_text()[-2000:]
                    time.sleep(0.05)
                res = {"kill_to_next_step_seconds": round(time.monotonic() - t_kill, 1),
                       "resumed_at_step": int(m[1]), "last_checkpoint_at_kill": killed_at_step}
            assert host.wait() == 0, log.read_text()[-2000:]
            other.wait()
        return res | {"wall_seconds": round(time.monotonic() - t0, 1), "steps": metrics(out)["steps"],
                      "world_size_at_end": metrics(out)["world_size"]}

    return {"uninterrupted": go(tmp / "el-ref", False), "node_lost": go(tmp / "el-kill", True)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/training_sharing.json"))
    p.add_argument("--parts", nargs="*",
                   default=["compression", "prefetch", "preemption", "search", "elastic"])
    args = p.parse_args()
    load_before = os.getloadavg()
    result = {"machine": "Intel host (2 vCPUs)", "date": time.strftime("%Y-%m-%d"),
              "load_average_before": [round(x, 2) for x in load_before],
              "workload": f"small encoder, {len(CLASSES)} Banking77 classes x 60 train rows, max_length 32"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        curated, labels = make_curated(tmp / "data", n_train=60)
        for part in args.parts:
            result[part] = globals()[part](tmp, curated, labels)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
