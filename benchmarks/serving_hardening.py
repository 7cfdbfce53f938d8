"""Benchmark: the serving path after the hardening, against itself before it and against
``mlflow models serve`` of a pyfunc wrapping the same int8 build.

Three contenders serve one int8 ONNX build (``--build``: a folder the export stage wrote,
with the model's contract, so every contender masks PII and applies the reject rule), run
side by side in one run with ``benchmarks/serving_compare.py``'s machinery (wrk, one
Banking77 test message per request in the same order for everyone, closed loop, contenders
take turns and rotate between repeats, medians over repeats):

* ``router``: this checkout's ``deploy.router`` -> ``deploy.server`` (body limit, byte-wise
  key checks with roles, per-request Unicode check, per-row retry of a failed batch, the
  fail-closed build check, the audit log on admin calls);
* ``router_before``: the same two processes from ``--baseline``, a checkout of the commit
  before the hardening (default: a git worktree of c262b68 made in the scratch folder);
* ``mlflow_int8``: ``mlflow models serve --env-manager local`` of a pyfunc (defined here)
  that loads the same int8 build with ``export.runtime.OnnxClassifier``, masks each text
  with the build's ``contract.preprocess.Preprocessor`` and answers label, score and oos
  with the build's reject rule: the work the model server does, without its micro-batching.

Before timing, the same messages go to all three one by one and their labels are compared.

    .venv/bin/python benchmarks/serving_hardening.py --build DIR [--baseline DIR] \
        [--concurrency 1 8 32] [--seconds 15] [--repeats 3]

Results: ``benchmarks/results/serving_hardening.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_HERE = ROOT / "benchmarks"
sys.path[:] = [str(ROOT)] + [q for q in sys.path if q and Path(q).resolve() not in (ROOT, _HERE)] + [str(_HERE)]

BASELINE_COMMIT = "c262b68"  # the last commit before the serving hardening (9c10bbd)
UPSTREAM_KEY = "bench-upstream-key"
CLIENT_KEY = "bench-client-key"
CODE_PATHS = ("export", "contract", "pii", "textnorm", "core")

try:
    import mlflow.pyfunc

    _PythonModel = mlflow.pyfunc.PythonModel
except ImportError:  # pragma: no cover
    _PythonModel = object


class OnnxInt8Model(_PythonModel):
    """pyfunc over an int8 ONNX build folder: texts in, label/score/oos out, masked and
    decided as the model server does (one call per request: no micro-batching)."""

    def __getstate__(self) -> dict:
        return {}  # the session is made in load_context, never pickled

    def load_context(self, context) -> None:
        from contract.preprocess import Preprocessor
        from contract.reject import RejectRule
        from export.runtime import OnnxClassifier

        threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
        self.clf = OnnxClassifier(context.artifacts["build"], threads=threads)
        self.preprocess = Preprocessor(self.clf.pre["text_preprocessing"])
        self.rule = RejectRule.from_dict(self.clf.pre.get("reject"))

    def predict(self, context, model_input, params=None):
        import pandas as pd

        from contract.reject import decide, softmax

        texts = [self.preprocess(str(t)) for t in model_input["text"].tolist()]
        answers = decide(softmax(self.clf.logits(texts)), self.clf.labels, self.rule)
        return pd.DataFrame({"label": [a["label"] or "" for a in answers],
                             "score": [a["score"] for a in answers], "oos": [a["oos"] for a in answers]})


def log_int8_pyfunc(build: Path, store: Path) -> tuple[str, str]:
    """Log and register the pyfunc in a private SQLite store; (tracking URI, model URI)."""
    import mlflow
    import pandas as pd
    from mlflow.tracking import MlflowClient

    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("servebench-int8")
    exp_id = exp.experiment_id if exp else client.create_experiment(
        "servebench-int8", artifact_location=(store / "artifacts").as_uri())
    # By value: ``mlflow models serve`` cannot import this benchmark module by name.
    import cloudpickle

    if OnnxInt8Model.__module__ != "__main__":
        cloudpickle.register_pickle_by_value(sys.modules[OnnxInt8Model.__module__])
    with mlflow.start_run(experiment_id=exp_id) as run:
        info = mlflow.pyfunc.log_model(
            name="int8", python_model=OnnxInt8Model(), artifacts={"build": str(build)},
            code_paths=[str(ROOT / p) for p in CODE_PATHS],
            input_example=pd.DataFrame({"text": ["my card has not arrived"]}))
    name = "servebench-int8"
    with contextlib.suppress(Exception):
        client.create_registered_model(name)
    mv = client.create_model_version(name, info.model_uri, run_id=run.info.run_id)
    for _ in range(120):
        if client.get_model_version(name, mv.version).status == "READY":
            break
        time.sleep(0.5)
    return uri, f"models:/{name}/{mv.version}"


def baseline_checkout(work: Path) -> Path:
    dst = work / f"baseline-{BASELINE_COMMIT}"
    if not (dst / "deploy" / "server.py").is_file():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(dst), BASELINE_COMMIT],
                       check=True, capture_output=True)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, help="an int8 build folder written by the export stage")
    ap.add_argument("--baseline", default=None, help=f"a checkout of the pre-hardening code (default: "
                                                     f"a worktree of {BASELINE_COMMIT})")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup-seconds", type=float, default=3)
    ap.add_argument("--threads", type=int, default=0, help="thread budget of every server (0: every core)")
    ap.add_argument("--base-port", type=int, default=8490)
    ap.add_argument("--agreement-messages", type=int, default=200)
    ap.add_argument("--work", default=None, help="scratch folder (default: <tmp>/servebench-hardening)")
    ap.add_argument("--out", default="benchmarks/results/serving_hardening.json")
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

    from export.onnx_build import hardware
    from export.runtime import default_threads

    threads = args.threads or default_threads()
    build = Path(args.build).resolve()
    pre = json.loads((build / "preprocessing.json").read_text())
    if pre.get("status") != "passed":
        raise SystemExit(f"{build}: the build did not pass its gate ({pre.get('status')})")
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "servebench-hardening"
    work.mkdir(parents=True, exist_ok=True)
    baseline = Path(args.baseline).resolve() if args.baseline else baseline_checkout(work)
    base_rev = subprocess.run(["git", "-C", str(baseline), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "deploy", "core"],
                                capture_output=True, text=True).stdout.strip())

    t0 = time.perf_counter()
    tracking_uri, model_uri = log_int8_pyfunc(build, work / "mlflow")
    log_s = time.perf_counter() - t0

    texts = pd.read_csv(ROOT / "data/banking77/test.csv").text.tolist()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS_", "MLFLOW_"))}
    base_env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                    OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                    INTENTOPS_AUDIT_LOG=str(work / "audit.jsonl"))
    logs = work / "logs"
    p = args.base_port
    procs: list[subprocess.Popen] = []
    contenders: list[Contender] = []
    try:
        for i, (name, code) in enumerate((("router", ROOT), ("router_before", baseline))):
            env = dict(base_env, PYTHONPATH=str(code))
            sp, rp = p + 2 * i, p + 2 * i + 1
            server = start([sys.executable, "-m", "deploy.server", "--build", str(build), "--port", str(sp),
                            "--threads", str(threads)], dict(env, INTENTOPS_API_KEYS=UPSTREAM_KEY),
                           logs / f"{name}-server.log", code)
            router = start([sys.executable, "-m", "deploy.router", "--stable", f"http://127.0.0.1:{sp}",
                            "--port", str(rp)],
                           dict(env, INTENTOPS_API_KEYS=CLIENT_KEY, INTENTOPS_UPSTREAM_KEY=UPSTREAM_KEY),
                           logs / f"{name}-router.log", code)
            procs += [server, router]
            wait_ready(f"http://127.0.0.1:{sp}/health/ready", server, logs / f"{name}-server.log")
            wait_ready(f"http://127.0.0.1:{rp}/health/ready", router, logs / f"{name}-router.log")
            contenders.append(Contender(name, f"http://127.0.0.1:{rp}", "/v1/predict", {"X-API-Key": CLIENT_KEY},
                                        body_predict, labels_predict, [router.pid, server.pid],
                                        metrics_url=f"http://127.0.0.1:{sp}/metrics"))
        # mlflow as a user would run it: its CLI, the local environment, the registered
        # version; no PYTHONPATH (the pyfunc imports the code logged with it).
        mlflow_env = dict(base_env, MLFLOW_TRACKING_URI=tracking_uri, MLFLOW_REGISTRY_URI=tracking_uri)
        mp = p + 4
        mlflow_p = start([str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", model_uri,
                          "--env-manager", "local", "--port", str(mp), "--workers", "1"],
                         mlflow_env, logs / "mlflow.log", work)
        procs.append(mlflow_p)
        wait_ready(f"http://127.0.0.1:{mp}/ping", mlflow_p, logs / "mlflow.log")
        contenders.append(Contender("mlflow_int8", f"http://127.0.0.1:{mp}", "/invocations", {}, body_mlflow,
                                    labels_mlflow, [mlflow_p.pid]))

        agree = agreement(contenders, texts[: args.agreement_messages])
        for c in contenders:
            load(c, texts, 4, args.warmup_seconds, "wrk", work)
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {c.name: {} for c in contenders}
        for conc in args.concurrency:
            for r in range(args.repeats):
                k = r % len(contenders)
                for c in contenders[k:] + contenders[:k]:
                    idle = [pid for o in contenders if o is not c for pid in o.pids]
                    res = measured(c, idle, texts, conc, args.seconds, "wrk", work)
                    res["settle_s"] = settle(c.pids)
                    runs[c.name].setdefault(conc, []).append(res)
                    print(f"c={conc} repeat {r + 1}/{args.repeats} {c.name}: {res['requests_per_s']:.1f} req/s, "
                          f"p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, errors {res['errors']}",
                          flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc)

    levels = {name: {str(c): median_level(rs) for c, rs in per.items()} for name, per in runs.items()}
    ratios: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for c in map(str, args.concurrency):
        now, before, ml = levels["router"][c], levels["router_before"][c], levels["mlflow_int8"][c]
        ratios[f"after_vs_before_rps_c{c}"] = round(now["requests_per_s"] / before["requests_per_s"], 3)
        ratios[f"after_vs_before_p50_c{c}"] = round(now["p50_ms"] / before["p50_ms"], 3)
        ratios[f"after_vs_before_p99_c{c}"] = round(now["p99_ms"] / before["p99_ms"], 3)
        ratios[f"router_vs_mlflow_int8_rps_c{c}"] = round(now["requests_per_s"] / ml["requests_per_s"], 3)
        targets[f"hardening_slowdown_c{c}"] = {"value": ratios[f"after_vs_before_rps_c{c}"],
                                               "target": ">= 0.95 of the throughput before",
                                               "passed": ratios[f"after_vs_before_rps_c{c}"] >= 0.95}
    table = markdown(levels, args.concurrency)
    write_results({
        "command": "python benchmarks/serving_hardening.py " + " ".join(
            a if not Path(a).is_absolute() else f"<{Path(a).name}>" for a in sys.argv[1:]),
        "code": {"router": f"{head_rev}{' + uncommitted changes' if dirty else ''}", "router_before": base_rev},
        "build": {"folder": build.name, **{k: pre.get(k) for k in ("status", "quantization", "model_version")},
                  "masking": (pre.get("text_preprocessing") or {}).get("pii_mode"),
                  "reject_threshold": (pre.get("reject") or {}).get("threshold")},
        "contenders": {
            "router": "deploy.router -> deploy.server of this checkout, API keys on both hops",
            "router_before": f"the same two processes from {base_rev} (before the hardening)",
            "mlflow_int8": "mlflow models serve --env-manager local of a pyfunc over the same int8 build "
                           "(benchmarks/serving_hardening.py OnnxInt8Model: masked, reject rule, one call per "
                           f"request); logged and registered in {log_s:.1f} s",
        },
        "threads": threads, "loadgen": "wrk", "seconds": args.seconds, "repeats": args.repeats,
        "hardware": hardware(threads), "agreement": agree, "levels": levels, "ratios": ratios,
        "targets": targets, "all_targets_passed": all(t["passed"] for t in targets.values()), "table": table,
    }, args.out)
    print()
    print(table)
    print(json.dumps(ratios, indent=1))


if __name__ == "__main__":
    main()
