"""Benchmark: the model server (deploy/server.py) under concurrent HTTP load.

Serves the int8 MiniLM build (built into ``var/bench/export/`` from the training
benchmark's model if it is not there yet, with the settings the export benchmark chose)
and drives it with ``--concurrency`` closed-loop clients, each sending one Banking77 test
message per request, for ``--seconds`` per level. Reports requests/s and p50/p99 latency
per concurrency level.

    .venv/bin/python benchmarks/serving.py [--concurrency 1 8 32] [--seconds 20]

Results go to ``benchmarks/results/serving.json``. The issue-7 benchmark (through the
router, against ``mlflow models serve`` and a plain PyTorch server, load from wrk) is
``benchmarks/serving_compare.py``; docs/BENCHMARKS.md quotes that one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_stages import write_results  # noqa: E402

KEY = "bench-key"


def ensure_build(model_dir: Path, out: Path) -> Path:
    if (out / "int8" / "model.onnx").exists():
        return out / "int8"
    from core.config import ExportConfig
    from export import build
    from textnorm import normalize_label

    test = pd.read_csv(ROOT / "data/banking77/test.csv")
    build.build_all(model_dir, test.text.tolist(), test.category.map(normalize_label).tolist(),
                    [str(i) for i in range(len(test))],
                    ExportConfig(fusions=["none"], per_channel=[True], reduce_range=[True]), out)
    return out / "int8"


async def load(url: str, texts: list[str], concurrency: int, seconds: float) -> dict[str, float]:
    import httpx

    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30,
                                 headers={"X-API-Key": KEY}) as client:
        async def worker(w: int) -> None:
            nonlocal errors
            i = w
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                r = await client.post("/v1/predict", json={"text": texts[i % len(texts)]})
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
                i += concurrency

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - t0
    ms = np.array(lat) * 1000
    return {"concurrency": concurrency, "requests": len(lat), "errors": errors,
            "requests_per_s": len(lat) / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=str(ROOT / "var/bench/training/accuracy/run/model"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--port", type=int, default=8190)
    args = ap.parse_args()
    build_dir = ensure_build(Path(args.model_dir), ROOT / "var/bench/export")
    texts = pd.read_csv(ROOT / "data/banking77/test.csv").text.tolist()
    env = dict(os.environ, INTENTOPS_API_KEYS=KEY, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "deploy.server", "--build", str(build_dir),
                             "--port", str(args.port)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{args.port}"
    try:
        import httpx

        for _ in range(300):
            try:
                if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        asyncio.run(load(url, texts, 4, 3))  # warm-up
        levels = [asyncio.run(load(url, texts, c, args.seconds)) for c in args.concurrency]
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    batch_sum = next(float(x.split()[-1]) for x in metrics.splitlines() if x.startswith("intentops_batch_size_sum"))
    batch_count = next(float(x.split()[-1]) for x in metrics.splitlines()
                       if x.startswith("intentops_batch_size_count"))
    write_results({"command": "python benchmarks/serving.py " + " ".join(sys.argv[1:]),
                   "build": str(build_dir), "server": "deploy.server, max_batch 32, max_delay 5 ms",
                   "levels": levels, "mean_batch_size": batch_sum / batch_count,
                   "cores": os.cpu_count()}, "benchmarks/results/serving.json")
    print(json.dumps(levels, indent=1))


if __name__ == "__main__":
    main()
