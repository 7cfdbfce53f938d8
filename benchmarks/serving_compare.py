"""Benchmark: the router + model server against ``mlflow models serve`` and a plain PyTorch server.

Three ways to serve the same trained MiniLM model (``--model-dir``, by default the
training benchmark's), run side by side in one run:

* ``router``: ``deploy.router`` in front of ``deploy.server`` serving the int8 ONNX build of
  that model (built into ``var/bench/export/`` like ``benchmarks/serving.py`` does), with
  API keys on both hops: the product's path.
* ``mlflow``: ``mlflow models serve --env-manager local`` for a registered version of the
  pyfunc the train stage logs (``training.task._log_model``: ``IntentClassifierModel`` with
  the model folder as its artifact), logged from the same folder into a private SQLite
  tracking store in the temp dir (``<tmp>/servebench/mlflow``), so the demo's store is
  untouched. Requests are ``/invocations`` with ``{"dataframe_records": [{"text": ...}]}``.
* ``torch``: a plain PyTorch server (this file, ``--torch-server``): uvicorn, one
  ``async`` endpoint that runs ``training.predictor.Predictor`` inline, so requests are
  answered strictly one at a time, no batching.

Before timing, the same test messages go to all three one by one and their labels are
compared (the int8 build against the fp32 pyfunc and eager model), so the figures are for
one model. Then, for each ``--concurrency`` level, each contender in turn gets
``--seconds`` of closed-loop load, ``--repeats`` times (the contender order rotates
between repeats); medians over repeats are reported. The load comes from ``wrk`` (C, its
own process, one thread; a Lua hook sends the Banking77 test messages in the same order
to every contender, one message per request, each connection sending its next request as
soon as it has the last answer). ``--loadgen httpx`` runs async httpx clients in this
process instead, as ``benchmarks/serving.py`` does; they cost 1.1 to 2.8 ms of CPU per
request on the cores the servers need (wrk: under 0.1 ms), more than the whole router
path at 32 clients, so they measure the load generator as much as the servers. Every server gets the same thread budget (``--threads``,
default every core: ORT intra-op threads for the int8 server, ``torch.set_num_threads``
for the plain server, ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` for all). Per level and
contender the CPU use (in cores) of the contender's process tree, of the load generator,
of the idle contenders and of every other process on the machine is measured, so a run
disturbed by another job shows it (``other_cpu_cores``); for the router path also the
int8 server's mean batch size.

The int8 build is ``--build`` or, by default, built from ``--model-dir`` into
``var/bench/export/`` (the training benchmark's model) or the scratch folder (any other).
Its side files must match the model's.

    .venv/bin/python benchmarks/serving_compare.py [--model-dir DIR] [--build DIR] \
        [--concurrency 1 8 32] [--seconds 15] [--repeats 1] [--loadgen wrk|httpx]

Results go to ``benchmarks/results/serving_compare.json``; a markdown table is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# benchmarks/export.py and benchmarks/training.py share names with the project's packages:
# the project goes first, this folder (for serving, data_stages) last.
_HERE = ROOT / "benchmarks"
sys.path[:] = [str(ROOT)] + [q for q in sys.path if q and Path(q).resolve() not in (ROOT, _HERE)] + [str(_HERE)]

MODEL_NAME = "intentops-banking77"
UPSTREAM_KEY = "bench-upstream-key"
DEFAULT_MODEL_DIR = "var/bench/training/accuracy/run/model"
TARGETS = {"router_vs_mlflow_rps_c32_min": 3.0, "router_rps_c32_min": 300.0, "router_p99_ms_c32_max": 150.0,
           "router_p50_ms_c1_max": 10.0}


# --------------------------------------------------------------------------------------
# The plain PyTorch server (run as its own process with --torch-server)
# --------------------------------------------------------------------------------------

def torch_server(model_dir: str, port: int, threads: int) -> None:
    import torch
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from training.predictor import Predictor

    torch.set_num_threads(threads)
    predictor = Predictor(model_dir)
    predictor.predict(["warm-up message about my card"])

    async def predict(request):
        # async and nothing awaited around the model call: the event loop is blocked while
        # the model runs, so requests are answered one at a time, each alone (batch of 1).
        body = await request.json()
        labels, scores = predictor.predict([str(body["text"])])
        return JSONResponse({"model_version": "torch-eager",
                             "predictions": [{"label": labels[0], "score": scores[0]}]})

    async def ready(request):
        return JSONResponse({"status": "ready"})

    app = Starlette(routes=[Route("/v1/predict", predict, methods=["POST"]),
                            Route("/health/ready", ready, methods=["GET"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --------------------------------------------------------------------------------------
# The MLflow side: the train stage's pyfunc, logged and registered in a private store
# --------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_mlflow_version(model_dir: Path, store: Path, model_sha: str) -> tuple[str, str]:
    """A version of ``MODEL_NAME`` in a private SQLite store whose pyfunc carries
    ``model_dir``, logged with the train stage's own code; (tracking URI, model URI)."""
    from mlflow.tracking import MlflowClient

    from core.config import PipelineConfig, TrackingConfig
    from training.task import _log_model

    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    with contextlib.suppress(Exception):
        for mv in client.search_model_versions(f"name='{MODEL_NAME}'"):
            if mv.tags.get("servebench.model_sha256") == model_sha and mv.status == "READY":
                return uri, f"models:/{MODEL_NAME}/{mv.version}"
    exp = client.get_experiment_by_name("servebench")
    exp_id = exp.experiment_id if exp else client.create_experiment(
        "servebench", artifact_location=(store / "artifacts").as_uri())
    run = client.create_run(exp_id, tags={"servebench.model_sha256": model_sha})
    cfg = PipelineConfig(tracking=TrackingConfig(uri=uri))
    logged_uri = _log_model(cfg, run.info.run_id, model_dir)  # the train stage's pyfunc logging
    with contextlib.suppress(Exception):
        client.create_registered_model(MODEL_NAME)
    mv = client.create_model_version(MODEL_NAME, logged_uri, run_id=run.info.run_id,
                                     tags={"servebench.model_sha256": model_sha})
    for _ in range(120):
        if client.get_model_version(MODEL_NAME, mv.version).status == "READY":
            break
        time.sleep(0.5)
    return uri, f"models:/{MODEL_NAME}/{mv.version}"


# --------------------------------------------------------------------------------------
# Contenders, processes and the load generator
# --------------------------------------------------------------------------------------

@dataclass
class Contender:
    name: str
    url: str
    path: str
    headers: dict[str, str]
    body: Any  # text -> bytes
    labels: Any  # response JSON -> list of labels
    pids: list[int] = field(default_factory=list)  # process groups that make up this contender
    metrics_url: str | None = None  # a deploy.server /metrics: the mean batch size is recorded


def body_predict(text: str) -> bytes:
    return json.dumps({"text": text}).encode()


def body_mlflow(text: str) -> bytes:
    return json.dumps({"dataframe_records": [{"text": text}]}).encode()


def labels_predict(doc: dict) -> list[str]:
    return [p["label"] for p in doc["predictions"]]


def labels_mlflow(doc: dict) -> list[str]:
    return [p["label"] for p in doc["predictions"]]


def start(cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    f = log.open("w")
    # A new session, so the whole tree (mlflow's CLI starts uvicorn as a child) is one group.
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited with {proc.returncode}; log:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.25)
    raise SystemExit(f"{url} not ready after {timeout:.0f} s; log:\n{log.read_text()[-4000:]}")


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of these processes and all their descendants so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs = [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
        for q in procs:
            with contextlib.suppress(psutil.Error):
                t = q.cpu_times()
                total += t.user + t.system
    return total


# wrk's Lua hooks: POST bodies read from a file (one JSON body per line) and sent in turn,
# the same sequence for every contender; a JSON line of counts and percentiles at the end.
WRK_SCRIPT = r"""
local bodies = {}
local sent = 0
wrk.method = "POST"
function init(args)
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
end
function request()
  sent = sent + 1
  return wrk.format(nil, nil, nil, bodies[(sent - 1) % #bodies + 1])
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"responses": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, '
    .. '"status": %d, "timeout": %d, "p50_us": %d, "p99_us": %d}\n', summary.requests, summary.duration,
    e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


def load_wrk(c: Contender, texts: list[str], concurrency: int, seconds: float, work: Path) -> dict[str, Any]:
    """Closed loop with wrk (C, one thread, ``concurrency`` keep-alive connections, each
    sending its next request as soon as it has the answer to the last). Its CPU use is
    its own (``loadgen_cpu_s``), not the servers'."""
    import resource

    bodies, script = work / f"wrk-bodies-{c.name}.txt", work / "wrk-post.lua"
    bodies.write_bytes(b"".join(c.body(t) + b"\n" for t in texts))
    script.write_text(WRK_SCRIPT)
    headers = [a for k, v in {"Content-Type": "application/json", **c.headers}.items() for a in ("-H", f"{k}: {v}")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # No other child of this process ends meanwhile (the servers run until the end), so
    # the children's CPU delta is wrk's.
    out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "60s",
                          "-s", str(script), *headers, c.url + c.path, "--", str(bodies)],
                         capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    wall = summary["duration_us"] / 1e6
    ok = summary["responses"] - summary["status"]  # wrk counts non-2xx answers among the responses
    errors = sum(summary[k] for k in ("connect", "read", "write", "status", "timeout"))
    return {"requests": ok, "errors": errors, "wall_s": wall, "requests_per_s": ok / wall,
            "p50_ms": summary["p50_us"] / 1000, "p99_ms": summary["p99_us"] / 1000,
            "loadgen_cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


async def load_httpx(c: Contender, texts: list[str], concurrency: int, seconds: float) -> dict[str, Any]:
    """Closed loop in this process: ``concurrency`` httpx async clients, each sends its next
    message as soon as it has the answer to the last (the approach of ``benchmarks/serving.py``)."""
    import httpx
    import numpy as np

    bodies = [c.body(t) for t in texts]
    lat: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json", **c.headers}
    async with httpx.AsyncClient(base_url=c.url, limits=limits, timeout=30, headers=headers) as client:
        stop_at = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            nonlocal errors
            i = w
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    r = await client.post(c.path, content=bodies[i % len(bodies)])
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
                i += concurrency

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - t0
    ms = np.array(lat) * 1000 if lat else np.array([float("nan")])
    return {"requests": len(lat), "errors": errors, "wall_s": wall, "requests_per_s": len(lat) / wall,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "loadgen_cpu_s": 0.0}


def load(c: Contender, texts: list[str], concurrency: int, seconds: float, loadgen: str, work: Path) -> dict[str, Any]:
    if loadgen == "wrk":
        return load_wrk(c, texts, concurrency, seconds, work)
    return asyncio.run(load_httpx(c, texts, concurrency, seconds))


def settle(pids: list[int], quiet_cores: float = 0.05, timeout: float = 60.0) -> float:
    """Wait until these process trees use less than ``quiet_cores``; the seconds waited.

    When the load generator stops, a server still answers the requests it had accepted:
    a server answering one request at a time under 32 clients can hold seconds of them,
    which would otherwise run during the next contender's measurement."""
    t0 = time.perf_counter()
    cpu = tree_cpu(pids)
    while time.perf_counter() - t0 < timeout:
        time.sleep(0.5)
        now = tree_cpu(pids)
        if (now - cpu) / 0.5 < quiet_cores:
            break
        cpu = now
    return time.perf_counter() - t0


def busy_cpu() -> float:
    """CPU seconds the whole machine has been busy (every process, not idle or iowait)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def batches(metrics_url: str | None) -> tuple[float, float]:
    """(texts, model calls) so far, from deploy.server's batch-size histogram."""
    if metrics_url is None:
        return 0.0, 0.0
    import httpx

    lines = httpx.get(metrics_url, timeout=10).text.splitlines()
    return tuple(next(float(x.split()[-1]) for x in lines if x.startswith(f"intentops_batch_size_{k} "))
                 for k in ("sum", "count"))


def measured(c: Contender, idle: list[int], texts: list[str], concurrency: int, seconds: float,
             loadgen: str, work: Path) -> dict[str, Any]:
    b0 = batches(c.metrics_url)
    server0, idle0, own0, all0 = tree_cpu(c.pids), tree_cpu(idle), time.process_time(), busy_cpu()
    res = load(c, texts, concurrency, seconds, loadgen, work)
    server_cpu, idle_cpu = tree_cpu(c.pids) - server0, tree_cpu(idle) - idle0
    gen_cpu, all_cpu = time.process_time() - own0 + res.pop("loadgen_cpu_s"), busy_cpu() - all0
    res["server_cpu_cores"] = server_cpu / res["wall_s"]  # 1.0 = one core busy all the time
    res["loadgen_cpu_cores"] = gen_cpu / res["wall_s"]  # wrk, or the httpx clients, plus this process
    res["idle_contenders_cpu_cores"] = idle_cpu / res["wall_s"]
    # Busy CPU of processes not of this run (another job on the machine) meanwhile.
    res["other_cpu_cores"] = max(0.0, all_cpu - server_cpu - idle_cpu - gen_cpu) / res["wall_s"]
    res["server_cpu_ms_per_request"] = 1000 * server_cpu / max(res["requests"], 1)
    if c.metrics_url:
        b1 = batches(c.metrics_url)
        res["mean_batch_size"] = (b1[0] - b0[0]) / max(b1[1] - b0[1], 1)
    return res


def agreement(contenders: list[Contender], texts: list[str]) -> dict[str, Any]:
    """The same messages to every contender one at a time; labels compared pairwise."""
    import httpx

    labels: dict[str, list[str]] = {}
    for c in contenders:
        with httpx.Client(base_url=c.url, timeout=30,
                          headers={"content-type": "application/json", **c.headers}) as client:
            out = []
            for t in texts:
                r = client.post(c.path, content=c.body(t))
                r.raise_for_status()
                out += c.labels(r.json())
            labels[c.name] = out
    names = [c.name for c in contenders]
    pairs = {f"{a}~{b}": sum(x == y for x, y in zip(labels[a], labels[b], strict=True)) / len(texts)
             for i, a in enumerate(names) for b in names[i + 1:]}
    return {"messages": len(texts), "label_agreement": pairs}


def median_level(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ["requests_per_s", "p50_ms", "p99_ms", "server_cpu_cores", "loadgen_cpu_cores",
            "idle_contenders_cpu_cores", "other_cpu_cores", "server_cpu_ms_per_request", "settle_s"]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in keys}
    if "mean_batch_size" in runs[0]:
        out["mean_batch_size"] = statistics.median(r["mean_batch_size"] for r in runs)
    out["requests"] = sum(r["requests"] for r in runs)
    out["errors"] = sum(r["errors"] for r in runs)
    out["repeats"] = [{k: r[k] for k in ("requests_per_s", "p50_ms", "p99_ms", "errors", "other_cpu_cores",
                                         "idle_contenders_cpu_cores")} for r in runs]
    return out


def markdown(levels: dict[str, dict[str, dict[str, Any]]], concurrency: list[int]) -> str:
    rows = ["| contender | concurrency | requests/s | p50 ms | p99 ms | errors | server CPU (cores) "
            "| load generator CPU | CPU of other processes |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in concurrency:
        for name, per in levels.items():
            m = per[str(c)]
            rows.append(f"| {name} | {c} | {m['requests_per_s']:.1f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} "
                        f"| {m['errors']} | {m['server_cpu_cores']:.2f} | {m['loadgen_cpu_cores']:.2f} "
                        f"| {m['other_cpu_cores']:.2f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=DEFAULT_MODEL_DIR, help="trained model folder (model_config.json ...)")
    ap.add_argument("--build", default=None,
                    help="an int8 ONNX build of --model-dir (default: built like benchmarks/serving.py does)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warmup-seconds", type=float, default=3)
    ap.add_argument("--threads", type=int, default=0, help="thread budget of every server (0: every core)")
    ap.add_argument("--mlflow-workers", type=int, default=1, help="uvicorn workers of mlflow models serve")
    ap.add_argument("--base-port", type=int, default=8290, help="ports base .. base+3")
    ap.add_argument("--agreement-messages", type=int, default=200)
    ap.add_argument("--loadgen", choices=["wrk", "httpx"], default="wrk",
                    help="wrk (a C program, its own process) or httpx clients in this process")
    ap.add_argument("--work", default=None, help="scratch folder (default: <tmp>/servebench)")
    ap.add_argument("--out", default="benchmarks/results/serving_compare.json")
    ap.add_argument("--torch-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    from export.runtime import default_threads

    threads = args.threads or default_threads()
    model_dir = (ROOT / args.model_dir).resolve()  # an absolute path stays as it is
    if args.torch_server:
        torch_server(str(model_dir), args.port, threads)
        return
    if args.loadgen == "wrk" and not shutil.which("wrk"):
        raise SystemExit("wrk is not on PATH (Debian: apt-get install wrk), or use --loadgen httpx")

    import pandas as pd

    # The project's packages first: importing serving.py puts benchmarks/ (with its own
    # export.py and training.py) at the front of sys.path again.
    import export.build  # noqa: F401
    import training.task  # noqa: F401
    from export.onnx_build import hardware

    # isort: split
    from data_stages import write_results
    from serving import KEY, ensure_build

    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "servebench"
    work.mkdir(parents=True, exist_ok=True)
    model_sha = sha256(model_dir / "model.pt")

    # The int8 build of this model: var/bench/export/ holds the build benchmarks/export.py
    # made from the default model; any other model is built into the scratch folder.
    default = (ROOT / DEFAULT_MODEL_DIR).resolve()
    export_out = ROOT / "var/bench/export" if model_dir == default else work / f"export-{model_sha[:12]}"
    build_dir = (ROOT / args.build).resolve() if args.build else ensure_build(model_dir, export_out)
    build_pre = json.loads((build_dir / "preprocessing.json").read_text())
    side_files = {f: sha256(build_dir / f) == sha256(model_dir / f) for f in ("labels.json", "tokenizer.json")}
    if not all(side_files.values()):
        raise SystemExit(f"{build_dir} was not built from {model_dir}: {side_files}")

    t0 = time.perf_counter()
    tracking_uri, mlflow_uri = ensure_mlflow_version(model_dir, work / "mlflow", model_sha)
    log_s = time.perf_counter() - t0

    texts = pd.read_csv(ROOT / "data/banking77/test.csv").text.tolist()
    load_before = os.getloadavg()
    p = args.base_port
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS_", "MLFLOW_"))}
    # The venv's bin/ first: mlflow models serve execs `uvicorn` from PATH.
    base_env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                    PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    logs = work / "logs"
    procs: list[subprocess.Popen] = []
    try:
        torch_p = start([sys.executable, str(Path(__file__).resolve()), "--torch-server", "--port", str(p),
                         "--model-dir", str(model_dir), "--threads", str(threads)],
                        base_env, logs / "torch.log", ROOT)
        procs.append(torch_p)
        server_p = start([sys.executable, "-m", "deploy.server", "--build", str(build_dir), "--port", str(p + 1),
                          "--threads", str(threads)],
                         dict(base_env, INTENTOPS_API_KEYS=UPSTREAM_KEY), logs / "server.log", ROOT)
        procs.append(server_p)
        router_p = start([sys.executable, "-m", "deploy.router", "--stable", f"http://127.0.0.1:{p + 1}",
                          "--port", str(p + 2)],
                         dict(base_env, INTENTOPS_API_KEYS=KEY, INTENTOPS_UPSTREAM_KEY=UPSTREAM_KEY),
                         logs / "router.log", ROOT)
        procs.append(router_p)
        # mlflow as a user would run it: its CLI from this venv, the local environment, the
        # registered version from the (private) registry; cwd the scratch folder, no
        # PYTHONPATH, so the pyfunc imports the code it was logged with.
        mlflow_env = {k: v for k, v in base_env.items() if k != "PYTHONPATH"}
        mlflow_env.update(MLFLOW_TRACKING_URI=tracking_uri, MLFLOW_REGISTRY_URI=tracking_uri)
        mlflow_p = start([str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", mlflow_uri,
                          "--env-manager", "local", "--port", str(p + 3), "--workers", str(args.mlflow_workers)],
                         mlflow_env, logs / "mlflow.log", work)
        procs.append(mlflow_p)

        wait_ready(f"http://127.0.0.1:{p}/health/ready", torch_p, logs / "torch.log")
        wait_ready(f"http://127.0.0.1:{p + 1}/health/ready", server_p, logs / "server.log")
        wait_ready(f"http://127.0.0.1:{p + 2}/health/ready", router_p, logs / "router.log")
        wait_ready(f"http://127.0.0.1:{p + 3}/ping", mlflow_p, logs / "mlflow.log")

        contenders = [
            Contender("router", f"http://127.0.0.1:{p + 2}", "/v1/predict", {"X-API-Key": KEY},
                      body_predict, labels_predict, [router_p.pid, server_p.pid],
                      metrics_url=f"http://127.0.0.1:{p + 1}/metrics"),
            Contender("mlflow", f"http://127.0.0.1:{p + 3}", "/invocations", {}, body_mlflow, labels_mlflow,
                      [mlflow_p.pid]),
            Contender("torch", f"http://127.0.0.1:{p}", "/v1/predict", {}, body_predict, labels_predict,
                      [torch_p.pid]),
        ]
        agree = agreement(contenders, texts[: args.agreement_messages])
        for c in contenders:
            load(c, texts, 4, args.warmup_seconds, args.loadgen, work)
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {c.name: {} for c in contenders}
        for conc in args.concurrency:
            for r in range(args.repeats):
                k = r % len(contenders)
                for c in contenders[k:] + contenders[:k]:
                    idle = [pid for o in contenders if o is not c for pid in o.pids]
                    res = measured(c, idle, texts, conc, args.seconds, args.loadgen, work)
                    res["settle_s"] = settle(c.pids)
                    runs[c.name].setdefault(conc, []).append(res)
                    print(f"c={conc} repeat {r + 1}/{args.repeats} {c.name}: {res['requests_per_s']:.1f} req/s, "
                          f"p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, errors {res['errors']}, "
                          f"settled after {res['settle_s']:.1f} s", flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc)

    levels = {name: {str(c): median_level(rs) for c, rs in per.items()} for name, per in runs.items()}
    hi, lo = str(max(args.concurrency)), str(min(args.concurrency))
    ratios: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    if hi == "32":
        rt, ml, tc = levels["router"][hi], levels["mlflow"][hi], levels["torch"][hi]
        ratios["router_vs_mlflow_rps_c32"] = rt["requests_per_s"] / ml["requests_per_s"]
        ratios["router_vs_torch_rps_c32"] = rt["requests_per_s"] / tc["requests_per_s"]
        targets["router_vs_mlflow_rps_c32"] = {
            "value": ratios["router_vs_mlflow_rps_c32"], "target": ">= 3.0",
            "passed": ratios["router_vs_mlflow_rps_c32"] >= TARGETS["router_vs_mlflow_rps_c32_min"]}
        targets["router_rps_c32"] = {"value": rt["requests_per_s"], "target": ">= 300",
                                     "passed": rt["requests_per_s"] >= TARGETS["router_rps_c32_min"]}
        targets["router_p99_ms_c32"] = {"value": rt["p99_ms"], "target": "<= 150",
                                        "passed": rt["p99_ms"] <= TARGETS["router_p99_ms_c32_max"]}
    if lo == "1":
        targets["router_p50_ms_c1"] = {"value": levels["router"][lo]["p50_ms"], "target": "<= 10",
                                       "passed": levels["router"][lo]["p50_ms"] <= TARGETS["router_p50_ms_c1_max"]}
        ratios["router_vs_mlflow_p50_c1"] = levels["router"][lo]["p50_ms"] / levels["mlflow"][lo]["p50_ms"]
    for c in args.concurrency:
        ratios[f"router_vs_mlflow_rps_c{c}"] = (levels["router"][str(c)]["requests_per_s"]
                                                / levels["mlflow"][str(c)]["requests_per_s"])
    table = markdown(levels, args.concurrency)

    def shown(path: Path) -> str:
        """A path as results may show it: relative to the project or to the scratch folder."""
        for base, name in ((ROOT, ""), (work, "<work>"), (Path(tempfile.gettempdir()), "<tmp>")):
            with contextlib.suppress(ValueError):
                return str(Path(name, path.resolve().relative_to(base.resolve())))
        return f"<elsewhere>/{path.name}"

    write_results({
        "command": "python benchmarks/serving_compare.py " + " ".join(
            shown(Path(a)) if Path(a).is_absolute() else a for a in sys.argv[1:]),
        "model_dir": shown(model_dir), "model_pt_sha256": model_sha,
        "contenders": {
            "router": {"what": "deploy.router -> deploy.server, int8 ONNX build, API keys on both hops",
                       "build": shown(build_dir),
                       "build_status": {k: build_pre.get(k) for k in ("status", "gate_reason", "quantization")},
                       "server": f"deploy.server defaults (max_batch 32, max_delay_ms 5, no ORT spinning), "
                                 f"ORT threads {threads}",
                       "build_side_files_match_model": side_files},
            "mlflow": {"what": "mlflow models serve --env-manager local, /invocations dataframe_records",
                       "model_uri": mlflow_uri, "workers": args.mlflow_workers,
                       "store": "private SQLite tracking store in the temp dir; pyfunc logged by "
                                "training.task._log_model from model_dir", "log_and_register_s": round(log_s, 1)},
            "torch": {"what": "plain PyTorch eager server (benchmarks/serving_compare.py --torch-server): uvicorn, "
                              "model run inline in the event loop, one request at a time, batch 1",
                      "torch_threads": threads},
        },
        "fairness": (f"{default_threads()} cores shared by everything: every server gets {threads} intra-op "
                     f"thread(s) "
                     f"(OMP/MKL_NUM_THREADS={threads}; ORT intra_op_num_threads / torch.set_num_threads); the router "
                     f"path is two processes (router + server); the load generator ({args.loadgen}) runs on the "
                     "same cores (its CPU use is loadgen_cpu_cores). Servers stay up for the whole "
                     "run; contenders take turns, idle while another is measured (idle_contenders_cpu_cores). "
                     "other_cpu_cores is CPU used meanwhile by processes not of this run: well above 0 means "
                     "the figures are from a contended machine."),
        "loadgen": args.loadgen, "seconds": args.seconds, "repeats": args.repeats,
        "warmup_seconds": args.warmup_seconds,
        "hardware": hardware(threads), "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
        "agreement": agree,
        "levels": levels, "ratios": ratios, "targets": targets,
        "all_targets_passed": all(t["passed"] for t in targets.values()),
        "table": table,
    }, args.out)
    print()
    print(table)
    print()
    for name, t in targets.items():
        print(f"{name}: {t['value']:.2f} (target {t['target']}) {'PASS' if t['passed'] else 'FAIL'}")


if __name__ == "__main__":
    main()
