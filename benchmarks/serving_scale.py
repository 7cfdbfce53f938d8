"""Benchmark: the serving tier that scales (replica pools, the response cache, the
autoscaler) on one int8 build.

Three parts, in one run, on the build given with ``--build`` (an export stage output with
the model's contract, so every path masks PII and applies the reject rule):

1. **Throughput and latency, cache off, varied texts** (every Banking77 test message once,
   in order): ``router`` (``deploy.router`` -> one ``deploy.server``) against the build's
   own batch-32 rows/s (``export.runtime.OnnxClassifier`` on batches of 32 in this
   process, same threads, measured before and after the HTTP runs) and against
   ``mlflow models serve`` of a pyfunc over the same build (``serving_hardening.py``'s
   ``OnnxInt8Model``). wrk, closed loop, contenders take turns, medians over repeats.
2. **30% repeated texts**: a second router with ``--cache-size`` in front of the same
   server, against the cache-off router, on a request stream where 30% of the requests
   repeat one of 50 messages and the rest are test messages made unique (a made-up word
   appended, new in every run, so no run is served from an earlier run's entries).
3. **A load step** through a real deployment (``Deployment``: router, stable server,
   ``deploy/autoscaler.py`` with min 1, max 2 replicas): 8 wrk connections, then 64; the
   time from the step until the second replica serves; down to 1 connection until it is
   removed; a hot reload (``Deployment.reload_stable``) under 8 connections; wrk's
   failed-request counts through all of it.

    .venv/bin/python benchmarks/serving_scale.py --build DIR [--seconds 15] [--repeats 3]

Results: ``benchmarks/results/serving_scale.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_HERE = ROOT / "benchmarks"
sys.path[:] = [str(ROOT)] + [q for q in sys.path if q and Path(q).resolve() not in (ROOT, _HERE)] + [str(_HERE)]

UPSTREAM_KEY = "bench-upstream-key"
CLIENT_KEY = "bench-client-key"


def build_rows_per_s(build: Path, texts: list[str], threads: int, batches: int = 30) -> float:
    """The build's own throughput: tokenize + ONNX on batches of 32 (no HTTP, no masking)."""
    from export.runtime import OnnxClassifier

    clf = OnnxClassifier(build, threads=threads)
    clf.logits(texts[:64])  # warm-up
    rates = []
    for r in range(3):
        chunk = [texts[(r * batches * 32 + i) % len(texts)] for i in range(batches * 32)]
        t0 = time.perf_counter()
        for i in range(0, len(chunk), 32):
            clf.logits(chunk[i:i + 32], batch_size=32)
        rates.append(len(chunk) / (time.perf_counter() - t0))
    return statistics.median(rates)


def _tag(i: int) -> str:
    """A made-up lower-case word, unique per ``i`` (no digits: the PII masking would fold
    numbers together, and the cache with them)."""
    out = ""
    while True:
        i, d = divmod(i, 26)
        out += chr(97 + d)
        if not i:
            return "zq" + out


def repeated_stream(texts: list[str], share: float, hot: int, n: int, run: int) -> list[str]:
    """``share`` of the requests repeat one of ``hot`` messages; the others are test
    messages made unique with a word of their own, new in every run (so no run finds the
    previous run's entries in the cache, and the 3,080 test messages never repeat)."""
    rnd = random.Random(run)
    hot_set = texts[:hot]
    rest = texts[hot:]
    return [rnd.choice(hot_set) if rnd.random() < share else f"{rest[i % len(rest)]} {_tag(run * n + i)}"
            for i in range(n)]


def load_step(build: Path, texts: list[str], work: Path, seconds: dict[str, float]) -> dict[str, Any]:
    import httpx
    from serving_compare import Contender, body_predict, labels_predict, load_wrk

    from core.config import load_config
    from deploy.deployment import Deployment

    root = work / "deploy"
    shutil.rmtree(root, ignore_errors=True)
    cfg = load_config(overrides={
        "deploy.root": str(root), "deploy.router_port": 0,
        "deploy.autoscale.min_replicas": 1, "deploy.autoscale.max_replicas": 2,
        "deploy.autoscale.interval_seconds": 1.0, "deploy.autoscale.up_cooldown_seconds": 5,
        "deploy.autoscale.down_after_seconds": 10, "deploy.autoscale.down_cooldown_seconds": 10})
    os.environ["INTENTOPS_AUDIT_LOG"] = str(work / "audit.jsonl")
    dep = Deployment(cfg)
    for v in ("1", "2"):
        dst = dep.root / "builds" / f"v{v}"
        shutil.copytree(build, dst)
        pre = json.loads((dst / "preprocessing.json").read_text())
        (dst / "preprocessing.json").write_text(json.dumps({**pre, "model_version": v}))
    state = dep.state()
    timeline: list[dict[str, Any]] = []
    t_start = time.time()

    def mark(event: str, **kw: Any) -> None:
        timeline.append({"t_s": round(time.time() - t_start, 2), "event": event, **kw})

    try:
        state["stable"] = dep.start_server(dep.root / "builds" / "v1", "1", "stable")
        mark("stable ready", cold_start_s=state["stable"]["cold_start_s"])
        dep.save(state)
        dep.ensure_router(state)
        dep.ensure_autoscaler(state)
        c = Contender("deployment", dep.state()["router"]["url"], "/v1/predict",
                      {"Authorization": f"Bearer {dep.client_key()}"}, body_predict, labels_predict)
        phases: dict[str, Any] = {}

        def run(name: str, conc: int, secs: float) -> None:
            phases[name] = load_wrk(c, texts, conc, secs, work)

        def replicas() -> int:
            return len(dep.stable_pool())

        run("c8 before the step", 8, seconds["base"])
        mark("step to 64 connections", replicas=replicas())
        step_at = time.time()
        th = threading.Thread(target=run, args=("c64 step", 64, seconds["step"]))
        th.start()
        added_after = None
        while th.is_alive():
            if added_after is None and replicas() >= 2:
                added_after = round(time.time() - step_at, 2)
                mark("second replica serving", after_step_s=added_after,
                     cold_start_s=(dep.extras() or [{}])[0].get("cold_start_s"))
            time.sleep(0.2)
        th.join()
        mark("down to 1 connection", replicas=replicas())
        th = threading.Thread(target=run, args=("c1 after the step", 1, seconds["calm"]))
        th.start()
        removed_after = None
        t_calm = time.time()
        while th.is_alive():
            if removed_after is None and added_after is not None and replicas() == 1:
                removed_after = round(time.time() - t_calm, 2)
                mark("back to one replica", after_calm_s=removed_after)
            time.sleep(0.2)
        th.join()
        th = threading.Thread(target=run, args=("c8 through a hot reload", 8, seconds["reload"]))
        th.start()
        time.sleep(seconds["reload"] / 3)
        mark("hot reload to v2")
        reloaded = dep.reload_stable(dep.root / "builds" / "v2", "2")
        mark("hot reload done", **reloaded)
        th.join()
        answer = httpx.post(f"{c.url}/v1/predict", json={"text": "my card has not arrived"}, headers=c.headers).json()
        records = [json.loads(x) for x in (work / "audit.jsonl").read_text().splitlines()]
        return {"phases": phases, "timeline": timeline, "replica_added_after_step_s": added_after,
                "replica_removed_after_calm_s": removed_after, "version_after_reload": answer["model_version"],
                "failed_requests": {k: v["errors"] for k, v in phases.items()},
                "scale_records": [{k: r[k] for k in ("at", "actor", "outcome", "reason")}
                                  for r in records if r["action"] == "scale"]}
    finally:
        dep.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--base-port", type=int, default=8590)
    ap.add_argument("--skip-step", action="store_true", help="parts 1 and 2 only")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default="benchmarks/results/serving_scale.json")
    args = ap.parse_args()

    import pandas as pd
    from data_stages import write_results
    from serving_compare import (
        Contender,
        agreement,
        body_mlflow,
        body_predict,
        labels_mlflow,
        labels_predict,
        load,
        markdown,
        measured,
        median_level,
        settle,
        start,
        stop,
        wait_ready,
    )
    from serving_hardening import log_int8_pyfunc

    from export.onnx_build import hardware
    from export.runtime import default_threads

    threads = args.threads or default_threads()
    build = Path(args.build).resolve()
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "servebench-scale"
    work.mkdir(parents=True, exist_ok=True)
    texts = pd.read_csv(ROOT / "data/banking77/test.csv").text.tolist()
    tracking_uri, model_uri = log_int8_pyfunc(build, work / "mlflow")

    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS_", "MLFLOW_"))}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT),
               INTENTOPS_AUDIT_LOG=str(work / "audit-http.jsonl"))
    logs, p = work / "logs", args.base_port
    procs: list[subprocess.Popen] = []
    rows_before = build_rows_per_s(build, texts, threads)
    try:
        server = start([sys.executable, "-m", "deploy.server", "--build", str(build), "--port", str(p),
                        "--threads", str(threads)], dict(env, INTENTOPS_API_KEYS=UPSTREAM_KEY), logs / "server.log",
                       ROOT)
        procs.append(server)
        wait_ready(f"http://127.0.0.1:{p}/health/ready", server, logs / "server.log")
        routers = {}
        for i, (name, cache) in enumerate((("router", 0), ("router_cache", 20000))):
            rp = start([sys.executable, "-m", "deploy.router", "--stable", f"http://127.0.0.1:{p}",
                        "--port", str(p + 1 + i), "--cache-size", str(cache)],
                       dict(env, INTENTOPS_API_KEYS=CLIENT_KEY, INTENTOPS_UPSTREAM_KEY=UPSTREAM_KEY),
                       logs / f"{name}.log", ROOT)
            procs.append(rp)
            wait_ready(f"http://127.0.0.1:{p + 1 + i}/health/ready", rp, logs / f"{name}.log")
            routers[name] = Contender(name, f"http://127.0.0.1:{p + 1 + i}", "/v1/predict",
                                      {"X-API-Key": CLIENT_KEY}, body_predict, labels_predict,
                                      [rp.pid, server.pid], metrics_url=f"http://127.0.0.1:{p}/metrics")
        mlflow_env = dict(env, MLFLOW_TRACKING_URI=tracking_uri, MLFLOW_REGISTRY_URI=tracking_uri)
        mlflow_env.pop("PYTHONPATH")
        mp = start([str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", model_uri,
                    "--env-manager", "local", "--port", str(p + 3), "--workers", "1"], mlflow_env,
                   logs / "mlflow.log", work)
        procs.append(mp)
        wait_ready(f"http://127.0.0.1:{p + 3}/ping", mp, logs / "mlflow.log")
        ml = Contender("mlflow_int8", f"http://127.0.0.1:{p + 3}", "/invocations", {}, body_mlflow, labels_mlflow,
                       [mp.pid])
        time.sleep(2)  # the cache router's first health check: its cache knows the version
        agree = agreement([routers["router"], ml], texts[:200])

        def rounds(contenders: list[Contender], stream, levels: list[int]) -> dict[str, Any]:
            """``stream(run)``: the messages of one wrk run, in order."""
            run = 0
            for c in contenders:
                load(c, stream(run), 4, 3, "wrk", work)
                run += 1
            runs: dict[str, dict[int, list]] = {c.name: {} for c in contenders}
            for conc in levels:
                for r in range(args.repeats):
                    k = r % len(contenders)
                    for c in contenders[k:] + contenders[:k]:
                        idle = [pid for o in contenders if o is not c for pid in o.pids if pid not in c.pids]
                        res = measured(c, idle, stream(run), conc, args.seconds, "wrk", work)
                        run += 1
                        res["settle_s"] = settle(c.pids)
                        runs[c.name].setdefault(conc, []).append(res)
                        print(f"c={conc} {c.name}: {res['requests_per_s']:.1f} req/s p50 {res['p50_ms']:.1f} "
                              f"p99 {res['p99_ms']:.1f} errors {res['errors']}", flush=True)
            return {n: {str(c): median_level(rs) for c, rs in per.items()} for n, per in runs.items()}

        varied = rounds([routers["router"], ml], lambda run: texts, [1, 32])
        # 30% repeats; 40,000 messages per run, more than a 15 s run sends without a cache
        repeated = rounds([routers["router"], routers["router_cache"]],
                          lambda run: repeated_stream(texts, 0.3, 50, 40000, run), [32])
    finally:
        for proc in reversed(procs):
            stop(proc)
    rows_after = build_rows_per_s(build, texts, threads)
    rows = statistics.mean([rows_before, rows_after])
    step = None if args.skip_step else load_step(build, texts, work, {"base": 15, "step": 45, "calm": 45,
                                                                      "reload": 15})
    rt32, rt1, ml32 = varied["router"]["32"], varied["router"]["1"], varied["mlflow_int8"]["32"]
    targets = {
        "router_vs_build_rows_c32": {"value": rt32["requests_per_s"] / rows, "target": ">= 0.8"},
        "router_p99_ms_c32": {"value": rt32["p99_ms"], "target": "<= 100"},
        "router_p50_ms_c1": {"value": rt1["p50_ms"], "target": "<= 5"},
        "router_vs_mlflow_int8_rps_c32": {"value": rt32["requests_per_s"] / ml32["requests_per_s"], "target": ">= 2"},
    }
    for t in targets.values():
        bound = float(t["target"].split()[1])
        t["passed"] = t["value"] >= bound if t["target"].startswith(">=") else t["value"] <= bound
    if step is not None:
        targets["zero_failed_requests_through_the_step"] = {
            "value": sum(step["failed_requests"].values()), "target": "== 0",
            "passed": sum(step["failed_requests"].values()) == 0}
    write_results({
        "command": "python benchmarks/serving_scale.py " + " ".join(
            a if not Path(a).is_absolute() else f"<{Path(a).name}>" for a in sys.argv[1:]),
        "build": build.name, "threads": threads, "seconds": args.seconds, "repeats": args.repeats,
        "build_rows_per_s_batch32": {"before": rows_before, "after": rows_after, "mean": rows},
        "agreement": agree, "varied_texts": varied, "repeated_30pct": repeated,
        "cache_ratio_c32": {"rps": repeated["router_cache"]["32"]["requests_per_s"]
                            / repeated["router"]["32"]["requests_per_s"],
                            "p99": repeated["router_cache"]["32"]["p99_ms"] / repeated["router"]["32"]["p99_ms"]},
        "load_step": step, "targets": targets, "hardware": hardware(threads),
        "tables": {"varied": markdown(varied, [1, 32]), "repeated_30pct": markdown(repeated, [32])},
    }, args.out)


if __name__ == "__main__":
    main()
