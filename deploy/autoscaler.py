"""The autoscaler: the stable variant's replica count follows its load.

    python -m deploy.autoscaler --config <resolved config JSON> [--host H --port P]

Started by the deployment (``Deployment.ensure_autoscaler``) when
``deploy.autoscale.max_replicas`` is above 1; stopped with the deployment. Every
``interval_seconds`` it reads the router's ``/admin/pools`` (requests outstanding per
replica: the queue depth, as the router sees it) and ``/admin/stats`` (the stable
variant's p99 over ``window_seconds``) and the replicas' CPU (``/proc``, per thread
budget), then decides (``decide``, a pure function):

* **up** by one when outstanding per replica is above ``target_outstanding``, or p99
  above ``max_p99_ms``, or CPU above ``max_cpu``, at most once per ``up_cooldown_seconds``;
* **down** by one when outstanding per replica has stayed below ``low_outstanding``, p99
  below half its limit and CPU below half its limit for ``down_after_seconds``, at most
  once per ``down_cooldown_seconds`` (and never right after a scale-up);
* always back inside ``[min_replicas, max_replicas]``; a replica that died is replaced.

Each change goes through ``Deployment.scale`` (start and warm first, then route; drain
before stopping) and is an audit record (``scale``) with the signals; each decision is
logged and counted on this process's ``/metrics``
(``intentops_autoscaler_decisions_total{direction}``,
``intentops_autoscaler_replicas{kind="desired"|"running"}`` and the signals).

The same policy in Kubernetes: an HPA with ``minReplicas``/``maxReplicas``, a CPU
utilization target and ``behavior.scaleUp/scaleDown.stabilizationWindowSeconds`` for the
cool-downs; or KEDA with a Prometheus trigger on ``intentops_router_outstanding`` (the
router's gauge) for the queue-depth rule.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("intentops.autoscaler")


@dataclass
class Signals:
    replicas: int  # stable replicas the router routes to and can use
    outstanding: float  # requests outstanding at those replicas, in total
    p99_ms: float | None  # stable p99 over the window (None: no traffic)
    cpu: float | None  # mean busy share of each replica's thread budget (0..1+)

    @property
    def per_replica(self) -> float:
        return self.outstanding / max(self.replicas, 1)


@dataclass
class Memory:
    """What ``decide`` remembers between calls."""
    last_up: float = -math.inf
    last_down: float = -math.inf
    calm_since: float | None = None
    history: list[tuple[float, int, str]] = field(default_factory=list)


def decide(s: Signals, running: int, policy: Any, mem: Memory, now: float,
           training_window: bool = False) -> tuple[int, str]:
    """The replica count to run and why (``running`` when nothing changes). Inside the
    training window (``training.window``) serving holds its minimum: the machines train."""
    lo, hi = policy.min_replicas, policy.max_replicas
    if training_window:
        if running != lo:
            return lo, f"training window: serving at its minimum ({running} -> {lo})"
        return running, "training window: serving held at its minimum"
    if running < lo:
        return lo, f"below the minimum ({running} < {lo})"
    if running > hi:
        return hi, f"above the maximum ({running} > {hi})"
    hot = []
    if s.per_replica > policy.target_outstanding:
        hot.append(f"outstanding {s.per_replica:.1f}/replica > {policy.target_outstanding:g}")
    if s.p99_ms is not None and s.p99_ms > policy.max_p99_ms:
        hot.append(f"p99 {s.p99_ms:.0f} ms > {policy.max_p99_ms:g}")
    if s.cpu is not None and s.cpu > policy.max_cpu:
        hot.append(f"cpu {s.cpu:.2f} > {policy.max_cpu:g}")
    calm = (s.per_replica < policy.low_outstanding
            and (s.p99_ms is None or s.p99_ms < policy.max_p99_ms / 2)
            and (s.cpu is None or s.cpu < policy.max_cpu / 2))
    mem.calm_since = (mem.calm_since if mem.calm_since is not None else now) if calm else None
    if hot:
        if running >= hi:
            return running, "hot at the maximum: " + "; ".join(hot)
        if now - mem.last_up < policy.up_cooldown_seconds:
            return running, "hot, cooling down after the last scale-up: " + "; ".join(hot)
        return running + 1, "; ".join(hot)
    if calm and running > lo:
        calm_for = now - mem.calm_since
        if calm_for < policy.down_after_seconds:
            return running, f"calm for {calm_for:.0f} s of {policy.down_after_seconds:g}"
        if now - max(mem.last_down, mem.last_up) < policy.down_cooldown_seconds:
            return running, "calm, cooling down after the last change"
        return running - 1, (f"calm for {calm_for:.0f} s: outstanding {s.per_replica:.1f}/replica, p99 "
                             f"{'-' if s.p99_ms is None else f'{s.p99_ms:.0f} ms'}, cpu "
                             f"{'-' if s.cpu is None else f'{s.cpu:.2f}'}")
    return running, "steady"


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Autoscaler:
    def __init__(self, cfg) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        from deploy.deployment import Deployment

        self.cfg = cfg
        self.policy = cfg.deploy.autoscale
        self.dep = Deployment(cfg)
        self.mem = Memory()
        self.cpu_mark: dict[int, tuple[float, float]] = {}
        r = self.registry = CollectorRegistry()
        self.decisions = Counter("intentops_autoscaler_decisions_total", "scale decisions by direction",
                                 ["direction"], registry=r)
        self.replicas = Gauge("intentops_autoscaler_replicas", "stable replicas", ["kind"], registry=r)
        self.signal = Gauge("intentops_autoscaler_signal", "the signals of the last decision", ["name"], registry=r)

    def signals(self, state: dict[str, Any]) -> Signals:
        import httpx

        url, headers = state["router"]["url"], self.dep._admin()
        pools = httpx.get(f"{url}/admin/pools", headers=headers, timeout=5).json()
        stable = [r for r in pools["stable"] if r["healthy"] and not r["ejected"]]
        since = time.time() - self.policy.window_seconds
        stats = httpx.get(f"{url}/admin/stats", params={"since": since}, headers=headers, timeout=5).json()
        urls = {r["url"] for r in stable}
        procs = [p for p in [state.get("stable"), *self.dep.extras()] if p and p.get("url") in urls]
        threads = max(self.cfg.deploy.server_threads, 1)
        shares = []
        now = time.monotonic()
        for p in procs:
            cpu = _cpu_seconds(p["pid"])
            if cpu is None:
                continue
            prev = self.cpu_mark.get(p["pid"])
            self.cpu_mark[p["pid"]] = (now, cpu)
            if prev and now > prev[0]:
                shares.append((cpu - prev[1]) / (now - prev[0]) / threads)
        return Signals(replicas=len(stable), outstanding=float(sum(r["outstanding"] for r in stable)),
                       p99_ms=stats["stable"]["p99_ms"], cpu=sum(shares) / len(shares) if shares else None)

    def step(self) -> tuple[int, str] | None:
        state = self.dep.state()
        if not self.dep.alive(state.get("router")) or not state.get("stable"):
            return None  # nothing to scale yet (or the deployment is stopping)
        if not self.dep.alive(state["stable"]):  # the stable server died: start it again
            from core import audit

            with self.dep.scaling():
                version = state["stable"]["version"]
                self.dep.ensure_stable(state, self.cfg.training.registered_model)
            audit.record("scale", f"{self.cfg.training.registered_model} stable v{version}", "replaced",
                         "autoscaler: the stable server had died", actor_="autoscaler")
            self.decisions.labels("replace").inc()
            return None
        running = len(self.dep.stable_pool(state))
        s = self.signals(state)
        now = time.time()
        from core import timewindow

        window = timewindow.inside(self.cfg.training.window, dt.datetime.now().astimezone()) \
            if self.cfg.training.window else False
        want, why = decide(s, running, self.policy, self.mem, now, training_window=window)
        for name, value in (("outstanding_per_replica", s.per_replica), ("p99_ms", s.p99_ms), ("cpu", s.cpu)):
            if value is not None:
                self.signal.labels(name).set(value)
        self.replicas.labels("running").set(running)
        self.replicas.labels("desired").set(want)
        direction = "up" if want > running else "down" if want < running else "hold"
        self.decisions.labels(direction).inc()
        if direction == "hold":
            log.debug("hold at %d: %s", running, why)
            return running, why
        log.info("scale %s %d -> %d: %s", direction, running, want, why)
        self.dep.scale(want, f"autoscaler: {why}", actor="autoscaler")
        if direction == "up":
            self.mem.last_up = time.time()
        else:
            self.mem.last_down = time.time()
        self.mem.history.append((now, want, why))
        return want, why

    def run(self) -> None:
        while True:
            try:
                self.step()
            except Exception as exc:  # one failed step (a replica that would not start) is logged, not fatal
                log.error("autoscaler step failed: %s", exc)
            time.sleep(self.policy.interval_seconds)


def main(argv: list[str] | None = None) -> int:
    import threading

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    from core.config import load_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the deployment's resolved config (JSON)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="its /metrics")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scaler = Autoscaler(load_config(args.config))
    threading.Thread(target=scaler.run, name="autoscaler", daemon=True).start()
    app = FastAPI(title="intentops autoscaler")

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(scaler.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health/ready")
    def ready() -> dict[str, Any]:
        return {"status": "ready", "history": scaler.mem.history[-20:]}

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")  # until SIGTERM
    # The scaling thread dies with this process; a replica it is still starting must not.
    for pid in scaler.dep.stop_unrecorded_children():
        log.info("stopped replica pid %d, still starting when the autoscaler stopped", pid)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
