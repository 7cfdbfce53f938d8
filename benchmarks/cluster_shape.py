"""Benchmark: the demo DAG in the cluster shape against the local shape (issue 28), on the
same machine in one sitting.

Both shapes run the same export (the builder's, ``--rows`` rows, seed 5) with the same
conf (the small encoder, ``--max-steps`` steps, canary bake 3 s; the behavioural and int8
gates lowered as in tests/test_cluster.py: a tiny model is near chance), triggered through
the REST API v2, from the POST to the run's end:

* ``local``: ``intentops up`` (airflow standalone: LocalExecutor on SQLite; Spark
  ``local[*]`` inside each spark-submit; MLflow on SQLite) in a private folder;
* ``cluster``: ``intentops cluster-up`` (CeleryExecutor with two workers on Postgres and
  Redis; Spark standalone master and two workers; MLflow on Postgres) in a private folder.

Each shape is started, measured and stopped before the next starts. Reported per shape:
the run's wall time, each task's duration (from the REST API's task instances) and the
start-up time of the shape. One run per shape: a comparison of where the time goes, not
a distribution.

    .venv/bin/python benchmarks/cluster_shape.py [--rows 3000] [--max-steps 40]

Results: ``benchmarks/results/cluster_shape.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_stages import cpu_model, write_results  # noqa: E402
from pipeline_run import _free_port, _seconds  # noqa: E402

from ops.airflow_api import AirflowApi  # noqa: E402

DAG = "intentops_pipeline"
GATES = {"INTENTOPS__TRAINING__MIN_FUNCTIONALITY": "0", "INTENTOPS__TRAINING__MIN_INVARIANCE": "0",
         "INTENTOPS__EXPORT__MIN_AGREEMENT": "0.95", "INTENTOPS__DEPLOY__MIN_REQUESTS": "15",
         "INTENTOPS__DEPLOY__MIN_PROBES": "15", "INTENTOPS__DEPLOY__POLL_SECONDS": "0.5",
         # No reviewer works here: the review_pull sensor polls once instead of holding the
         # local shape's run 5 minutes (the cluster shape has no Label Studio and skips it).
         "INTENTOPS__LABELING__PULL_WAIT_MINUTES": "0"}


def _cli(env: dict[str, str], *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "ops.cli", *args], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"intentops {' '.join(args)} failed:\n{(out.stdout + out.stderr)[-4000:]}")
    return json.loads(out.stdout[out.stdout.index("{"):]) if "{" in out.stdout else {}


def measure(shape: str, base: Path, export: Path, conf: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS__", "AIRFLOW", "MLFLOW_TRACKING_"))}
    env.update(GATES, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
               INTENTOPS__INPUT__PATH=str(export))
    if shape == "cluster":
        env["INTENTOPS_CLUSTER_ROOT"] = str(base)
        up_cmd, down_cmd = "cluster-up", "cluster-down"
    else:
        env.update(AIRFLOW_HOME=str(base / "airflow"), INTENTOPS_SERVICES_ROOT=str(base / "services"),
                   INTENTOPS_MLFLOW_STORE=str(base / "mlflow"), INTENTOPS__LAKE_ROOT=str(base / "lake"),
                   INTENTOPS__DEPLOY__ROOT=str(base / "deploy"), INTENTOPS_AIRFLOW_PORT=str(_free_port()),
                   INTENTOPS_MLFLOW_PORT=str(_free_port()), INTENTOPS_LABEL_STUDIO_PORT=str(_free_port()),
                   INTENTOPS__DEPLOY__ROUTER_PORT=str(_free_port()),
                   AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}')
        up_cmd, down_cmd = "up", "down"
    t0 = time.monotonic()
    info = _cli(env, up_cmd)
    startup = round(time.monotonic() - t0, 1)
    try:
        if shape == "cluster":
            password = json.loads((base / "airflow" / "passwords.json").read_text())["admin"]
        else:
            home = base / "airflow"
            password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        api = AirflowApi(info["airflow"]["url"], "admin", password)
        api.wait_dag(DAG, timeout=300)
        api.unpause_without_the_scheduled_run(DAG)
        t1 = time.monotonic()
        run = api.trigger(conf)
        done = api.wait_runs([run], timeout=3600)[run]
        wall = round(time.monotonic() - t1, 1)
        tis = api("GET", f"/dags/{DAG}/dagRuns/{run}/taskInstances")["task_instances"]
        tasks = {t["task_id"]: {"state": t["state"], "seconds": _seconds(t["start_date"], t["end_date"]),
                                "tries": t["try_number"]} for t in tis}
        return {"state": done["state"], "run_seconds": wall, "startup_seconds": startup, "tasks": tasks}
    finally:
        _cli(env, down_cmd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=3000)
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--shapes", nargs="+", default=["local", "cluster"])
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="intentops-shapes-") as tmp:
        tmp = Path(tmp)
        tmp.chmod(0o755)  # the cluster's Postgres runs as the postgres user and must reach its data
        subprocess.run([sys.executable, "-m", "demo.builder", "--out", str(tmp / "raw"), "--rows", str(args.rows),
                        "--seed", "5", "--format", "csv"], cwd=ROOT, check=True, capture_output=True, timeout=900)
        conf = {"input_path": str(tmp / "raw" / "raw.csv"), "model": "small", "epochs": 1,
                "max_steps": args.max_steps, "learning_rate": 0.002, "canary_bake_seconds": 3,
                "max_suspect_rate": 0.25}
        results = {shape: measure(shape, tmp / shape, tmp / "raw" / "raw.csv", conf) for shape in args.shapes}
    out = {"benchmark": "cluster_shape", "rows": args.rows, "max_steps": args.max_steps,
           "machine": {"cpu": cpu_model(), "cores": os.cpu_count()}, "date": time.strftime("%Y-%m-%d"),
           "command": "benchmarks/cluster_shape.py " + " ".join(argv or sys.argv[1:]), "shapes": results}
    write_results(out, "benchmarks/results/cluster_shape.json")
    for shape, r in results.items():
        print(f"{shape}: {r['state']} in {r['run_seconds']} s (start-up {r['startup_seconds']} s)")
        for task, t in r["tasks"].items():
            print(f"  {task:15s} {t['state']:>16s} {t['seconds']} s, tries {t['tries']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
