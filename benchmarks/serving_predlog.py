"""Benchmark: what the prediction log costs serving (issue 25; target: at most 5% of the
throughput).

Two contenders of this checkout serve one int8 ONNX build (``--build``: a folder the export
stage wrote) through the router, with ``benchmarks/serving_compare.py``'s machinery (wrk,
one Banking77 test message per request in the same order for both, closed loop,
contenders take turns and rotate between repeats, medians over repeats):

* ``predlog``: ``deploy.router`` -> ``deploy.server --prediction-log <db>`` logging every
  request (sample 1.0: the worst case), with both ``/metrics`` endpoints scraped every
  ``--scrape-interval`` seconds while it is measured (default 1 s: fifteen times as often
  as the Prometheus configuration ``make up`` writes);
* ``no_log``: the same two processes without a prediction log.

The log's rows are counted after the run (every answered request of ``predlog`` must be
there).

    .venv/bin/python benchmarks/serving_predlog.py --build DIR [--concurrency 1 8 32] \
        [--seconds 10] [--repeats 3]

Results: ``benchmarks/results/serving_predlog.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_HERE = ROOT / "benchmarks"
sys.path[:] = [str(ROOT)] + [q for q in sys.path if q and Path(q).resolve() not in (ROOT, _HERE)] + [str(_HERE)]

UPSTREAM_KEY = "bench-upstream-key"
CLIENT_KEY = "bench-client-key"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, help="an int8 build folder written by the export stage")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup-seconds", type=float, default=3)
    ap.add_argument("--threads", type=int, default=0, help="thread budget of every server (0: every core)")
    ap.add_argument("--base-port", type=int, default=8590)
    ap.add_argument("--allow-preprocessing-drift", action="store_true",
                    help="serve a build whose preprocessing version differs from this checkout's "
                         "(both contenders alike; the throughput is unaffected)")
    ap.add_argument("--scrape-interval", type=float, default=1.0,
                    help="seconds between scrapes of predlog's /metrics endpoints (0: no scraping)")
    ap.add_argument("--work", default=None, help="scratch folder (default: <tmp>/servebench-predlog)")
    ap.add_argument("--out", default="benchmarks/results/serving_predlog.json")
    args = ap.parse_args()

    import pandas as pd
    from data_stages import write_results
    from serving_compare import (
        Contender,
        body_predict,
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
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "servebench-predlog"
    work.mkdir(parents=True, exist_ok=True)
    db = work / "predictions.db"
    for f in work.glob("predictions.db*"):
        f.unlink()
    head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "deploy", "core"],
                                capture_output=True, text=True).stdout.strip())

    texts = pd.read_csv(ROOT / "data/banking77/test.csv").text.tolist()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS_", "MLFLOW_"))}
    base_env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                    OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT),
                    INTENTOPS_AUDIT_LOG=str(work / "audit.jsonl"))
    logs = work / "logs"
    p = args.base_port
    procs: list[subprocess.Popen] = []
    contenders: list[Contender] = []
    scrape_urls: dict[str, list[str]] = {}
    try:
        for i, (name, extra) in enumerate((("predlog", ["--prediction-log", str(db), "--variant", "bench"]),
                                           ("no_log", []))):
            sp, rp = p + 2 * i, p + 2 * i + 1
            server = start([sys.executable, "-m", "deploy.server", "--build", str(build), "--port", str(sp),
                            "--threads", str(threads), *extra,
                            *(["--allow-preprocessing-drift"] if args.allow_preprocessing_drift else [])], dict(base_env, INTENTOPS_API_KEYS=UPSTREAM_KEY),
                           logs / f"{name}-server.log", ROOT)
            router = start([sys.executable, "-m", "deploy.router", "--stable", f"http://127.0.0.1:{sp}",
                            "--port", str(rp)],
                           dict(base_env, INTENTOPS_API_KEYS=CLIENT_KEY, INTENTOPS_UPSTREAM_KEY=UPSTREAM_KEY),
                           logs / f"{name}-router.log", ROOT)
            procs += [server, router]
            if name == "predlog":
                scrape_urls[name] = [f"http://127.0.0.1:{sp}/metrics", f"http://127.0.0.1:{rp}/metrics"]
            wait_ready(f"http://127.0.0.1:{sp}/health/ready", server, logs / f"{name}-server.log")
            wait_ready(f"http://127.0.0.1:{rp}/health/ready", router, logs / f"{name}-router.log")
            contenders.append(Contender(name, f"http://127.0.0.1:{rp}", "/v1/predict", {"X-API-Key": CLIENT_KEY},
                                        body_predict, labels_predict, [router.pid, server.pid],
                                        metrics_url=f"http://127.0.0.1:{sp}/metrics"))
        for c in contenders:
            load(c, texts, 4, args.warmup_seconds, "wrk", work)
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {c.name: {} for c in contenders}
        for conc in args.concurrency:
            for r in range(args.repeats):
                k = r % len(contenders)
                for c in contenders[k:] + contenders[:k]:
                    idle = [pid for o in contenders if o is not c for pid in o.pids]
                    urls = scrape_urls.get(c.name, []) if args.scrape_interval > 0 else []
                    with Scraper(urls, args.scrape_interval) as scraper:
                        res = measured(c, idle, texts, conc, args.seconds, "wrk", work)
                    res["scrapes"] = scraper.count
                    res["settle_s"] = settle(c.pids)
                    runs[c.name].setdefault(conc, []).append(res)
                    print(f"c={conc} repeat {r + 1}/{args.repeats} {c.name}: {res['requests_per_s']:.1f} req/s, "
                          f"p50 {res['p50_ms']:.1f} ms, p99 {res['p99_ms']:.1f} ms, errors {res['errors']}",
                          flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc)  # SIGTERM: the server's writer commits what it still holds

    con = sqlite3.connect(str(db))
    logged = con.execute("SELECT COUNT(*) FROM predictions").fetchone()[0]
    con.close()
    answered = sum(r["requests"] - r["errors"] for rs in runs["predlog"].values() for r in rs)
    levels = {name: {str(c): median_level(rs) for c, rs in per.items()} for name, per in runs.items()}
    ratios: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for c in map(str, args.concurrency):
        on, off = levels["predlog"][c], levels["no_log"][c]
        ratios[f"predlog_vs_no_log_rps_c{c}"] = round(on["requests_per_s"] / off["requests_per_s"], 3)
        ratios[f"predlog_vs_no_log_p50_c{c}"] = round(on["p50_ms"] / off["p50_ms"], 3)
        ratios[f"predlog_vs_no_log_p99_c{c}"] = round(on["p99_ms"] / off["p99_ms"], 3)
        targets[f"predlog_overhead_c{c}"] = {"value": ratios[f"predlog_vs_no_log_rps_c{c}"],
                                             "target": ">= 0.95 of the throughput without the log",
                                             "passed": ratios[f"predlog_vs_no_log_rps_c{c}"] >= 0.95}
    table = markdown(levels, args.concurrency)
    write_results({
        "command": "python benchmarks/serving_predlog.py " + " ".join(
            a if not Path(a).is_absolute() else f"<{Path(a).name}>" for a in sys.argv[1:]),
        "code": f"{head_rev}{' + uncommitted changes' if dirty else ''}",
        "build": {"folder": build.name, **{k: pre.get(k) for k in ("status", "quantization", "model_version")},
                  "masking": (pre.get("text_preprocessing") or {}).get("pii_mode")},
        "contenders": {
            "predlog": "deploy.router -> deploy.server --prediction-log (every request logged), "
                       f"both /metrics scraped every {args.scrape_interval} s while measured",
            "no_log": "the same two processes without a prediction log",
        },
        # Rows in the log against predictions answered while measured; the warm-up's rows
        # are in the log too, so logged >= answered when nothing was dropped.
        "log": {"rows": logged, "answered_while_measured": answered},
        "scrape_interval_s": args.scrape_interval,
        "allow_preprocessing_drift": args.allow_preprocessing_drift,
        "threads": threads, "loadgen": "wrk", "seconds": args.seconds, "repeats": args.repeats,
        "hardware": hardware(threads), "levels": levels, "ratios": ratios,
        "targets": targets, "all_targets_passed": all(t["passed"] for t in targets.values()), "table": table,
    }, args.out)
    print()
    print(table)
    print(json.dumps(ratios, indent=1), f"\nlogged {logged} rows, answered {answered} while measured")


class Scraper:
    """Fetches each URL every ``interval`` seconds on a thread while the block runs, as
    Prometheus would (``count``: scrapes answered with 200)."""

    def __init__(self, urls: list[str], interval: float) -> None:
        import threading

        self.urls, self.interval, self.count = urls, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import urllib.request

        while not self._stop.wait(self.interval):
            for url in self.urls:
                with urllib.request.urlopen(url, timeout=5) as r:
                    r.read()
                    self.count += r.status == 200

    def __enter__(self) -> Scraper:
        if self.urls:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.urls:
            self._thread.join()


if __name__ == "__main__":
    main()
