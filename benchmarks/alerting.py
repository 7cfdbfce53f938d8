"""Benchmark: from a fault to the page, through the real monitoring stack.

The monitoring stack of ``make up`` (``ops/monitoring/stack.py``: Prometheus,
Alertmanager, the Pushgateway and the receiver, with their default 5 s intervals and the
shipped ``rules.yml``) watches a router in front of a healthy model server under steady
load (4 closed-loop clients). The fault: the router's stable variant is switched to a
server that fails every request (``--inject-fail-rate 1.0``) through the router's admin
API, as a bad build would. Measured: the time from the switch to the
``IntentopsHighErrorRate`` alert at the receiver (the audit log), and after switching back
the time to its ``resolved`` notice. ``--repeats`` faults in a row.

    .venv/bin/python benchmarks/alerting.py --build <export>/int8 [--repeats 3]

Results: ``benchmarks/results/alerting.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_HERE = ROOT / "benchmarks"
sys.path[:] = [str(ROOT)] + [q for q in sys.path if q and Path(q).resolve() not in (ROOT, _HERE)] + [str(_HERE)]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, timeout: float = 120) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} never ready")


def main() -> None:
    import httpx
    from data_stages import write_results

    from export.onnx_build import hardware
    from ops.monitoring import stack

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/alerting.json")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="alertbench-"))
    ports = stack.MonitoringPorts(prometheus=free_port(), alertmanager=free_port(), pushgateway=free_port(),
                                  receiver=free_port())
    deploy_root = work / "deploy"
    stack.write_configs(work, ports, deploy_root)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(ROOT), INTENTOPS_AUDIT_LOG=str(work / "audit.jsonl"))
    procs: list[subprocess.Popen] = []

    def spawn(cmd: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen:
        p = subprocess.Popen(cmd, env={**env, **(extra or {})}, cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    client, internal, admin = "bench-client", "bench-internal", "bench-admin"
    faults = []
    try:
        for name, cmd in stack.commands(work, ports, sys.executable).items():
            spawn(cmd)
            wait(ports.url(stack.PORT_OF[name]) + stack.HEALTH[name])
        good, bad, rport = free_port(), free_port(), free_port()
        for port, extra in ((good, []), (bad, ["--inject-fail-rate", "1.0"])):
            spawn([sys.executable, "-m", "deploy.server", "--build", args.build, "--port", str(port), *extra],
                  {"INTENTOPS_API_KEYS": internal})
            wait(f"http://127.0.0.1:{port}/health/ready")
        spawn([sys.executable, "-m", "deploy.router", "--stable", f"http://127.0.0.1:{good}", "--port", str(rport)],
              {"INTENTOPS_API_KEYS": client, "INTENTOPS_UPSTREAM_KEY": internal, "INTENTOPS_ADMIN_KEYS": admin})
        router = f"http://127.0.0.1:{rport}"
        wait(f"{router}/health/ready")
        targets = deploy_root / "prometheus"
        targets.mkdir(parents=True)
        (targets / "bench.router.json").write_text(json.dumps([{"targets": [f"127.0.0.1:{rport}"]}]))
        (targets / "bench.servers.json").write_text(json.dumps([{"targets": [f"127.0.0.1:{good}", f"127.0.0.1:{bad}"]}]))

        go = True

        def load() -> None:
            with httpx.Client(timeout=30) as c:
                while go:
                    c.post(f"{router}/v1/predict", json={"text": "my card has not arrived"},
                           headers={"Authorization": f"Bearer {client}"})

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(20)  # a healthy baseline in Prometheus

        def alerts() -> list[dict]:
            return httpx.get(f"{ports.url('receiver')}/alerts").json()["alerts"]

        def route(url: str) -> None:
            r = httpx.put(f"{router}/admin/routes", json={"stable": url}, headers={"Authorization": f"Bearer {admin}"})
            r.raise_for_status()

        for i in range(args.repeats):
            seen = len(alerts())
            t0 = time.time()
            route(f"http://127.0.0.1:{bad}")
            fired = resolved = None
            while time.time() - t0 < 180 and fired is None:
                if any(a["labels"].get("alertname") == "IntentopsHighErrorRate" and a["status"] == "firing"
                       for a in alerts()[seen:]):
                    fired = time.time() - t0
                time.sleep(0.2)
            seen = len(alerts())
            t1 = time.time()
            route(f"http://127.0.0.1:{good}")
            while time.time() - t1 < 300 and resolved is None:
                if any(a["labels"].get("alertname") == "IntentopsHighErrorRate" and a["status"] == "resolved"
                       for a in alerts()[seen:]):
                    resolved = time.time() - t1
                time.sleep(0.2)
            faults.append({"fault_to_page_s": None if fired is None else round(fired, 1),
                           "recovery_to_resolved_s": None if resolved is None else round(resolved, 1)})
            print(f"fault {i + 1}: paged after {fired} s, resolved after {resolved} s", flush=True)
            time.sleep(10)
        go = False
        for t in threads:
            t.join()
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    audit = [json.loads(x) for x in (work / "audit.jsonl").read_text().splitlines()]
    paged = [x for x in faults if x["fault_to_page_s"] is not None]
    write_results({
        "command": "python benchmarks/alerting.py " + " ".join(
            a if not Path(a).is_absolute() else f"<{Path(a).name}>" for a in sys.argv[1:]),
        "intervals": "scrape and evaluation 5 s, rule `for: 15s` over rate[30s], Alertmanager group_wait 5 s",
        "faults": faults,
        "median_fault_to_page_s": statistics.median(x["fault_to_page_s"] for x in paged) if paged else None,
        "max_fault_to_page_s": max(x["fault_to_page_s"] for x in paged) if paged else None,
        "target": "<= 60 s", "passed": bool(paged) and len(paged) == len(faults)
        and max(x["fault_to_page_s"] for x in paged) <= 60,
        "audit_records": sum(1 for r in audit if r["action"] == "alert"),
        "load_average_1_5_15": os.getloadavg(), "hardware": hardware(2),
    }, args.out)


if __name__ == "__main__":
    main()
