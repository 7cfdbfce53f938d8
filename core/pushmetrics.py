"""Metrics of short-lived processes, pushed to the Prometheus Pushgateway or sent over StatsD.

Training (throughput, step time, loss, CPU, memory, and GPU utilization and memory through
NVML where a GPU exists), the pipeline (a run failed or succeeded, task durations),
the deployment (when the champion was promoted) and the monitoring check (drift verdict
and figures) are not scraped: they push here when
``INTENTOPS_PUSHGATEWAY_URL`` is set (``make up`` sets it for Airflow's tasks). A push that
fails is logged and dropped: monitoring being down never stops a run.

Each stage's duration and outcome (published, cache hit, failed) goes over StatsD instead
(``stage``), to the bridge ``make up`` starts (``ops/monitoring/statsd_bridge.py``) when
``INTENTOPS_STATSD_ADDR`` (``host:port``) is set: counters must outlive the task that
counts, which a Pushgateway group replaced at every push cannot do, and Airflow's own task
metrics arrive at the same bridge. UDP: a send never waits and never fails a stage.
"""

from __future__ import annotations

import logging
import os
import time

from core import sysinfo

log = logging.getLogger("intentops.push")
_last: dict[str, float] = {}


def gateway() -> str | None:
    return os.environ.get("INTENTOPS_PUSHGATEWAY_URL") or None


def push(job: str, grouping: dict[str, str], gauges: dict[str, tuple[float, str]],
         labels: dict[str, str] | None = None, every_s: float = 0.0) -> bool:
    """Replace the group ``job``/``grouping`` with ``gauges`` (name -> (value, help)), each
    with ``labels``. ``every_s``: skip when this group was pushed less than that ago."""
    url = gateway()
    if not url:
        return False
    key = job + repr(sorted(grouping.items()))
    now = time.monotonic()
    if every_s and now - _last.get(key, -1e9) < every_s:
        return False
    _last[key] = now
    from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

    reg = CollectorRegistry()
    names = sorted(labels or {})
    for name, (value, doc) in gauges.items():
        if value is None:
            continue
        g = Gauge(name, doc, names, registry=reg)
        (g.labels(**labels) if names else g).set(value)
    try:
        push_to_gateway(url, job=job, grouping_key=grouping, registry=reg, timeout=3)
        return True
    except Exception as exc:  # monitoring down: log and go on
        log.warning("push to the Pushgateway at %s failed: %s", url, exc)
        return False


def statsd_addr() -> tuple[str, int] | None:
    addr = os.environ.get("INTENTOPS_STATSD_ADDR") or ""
    host, _, port = addr.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def send_statsd(lines: list[str]) -> bool:
    """Send StatsD lines in one datagram to ``INTENTOPS_STATSD_ADDR``; False when unset or
    the send failed (logged)."""
    addr = statsd_addr()
    if not addr or not lines:
        return False
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto("\n".join(lines).encode(), addr)
        return True
    except OSError as exc:
        log.warning("StatsD send to %s:%d failed: %s", *addr, exc)
        return False


def _tag(value: str) -> str:
    return "".join(c if c not in ",=:|#\n" else "_" for c in value)


def stage(stage: str, dataset: str, outcome: str, seconds: float) -> bool:
    """One stage attempt: ``outcome`` is ``published``, ``cache_hit`` or ``failed``.
    Becomes ``intentops_stage_runs_total`` and ``intentops_stage_duration_seconds``
    (a histogram) with the labels ``stage``, ``dataset`` and ``outcome`` at the bridge."""
    tags = f"stage={_tag(stage)},dataset={_tag(dataset)},outcome={_tag(outcome)}"
    return send_statsd([f"intentops.stage.runs,{tags}:1|c",
                        f"intentops.stage.duration,{tags}:{max(seconds, 0.0) * 1000:.3f}|ms"])


def _gpu() -> tuple[float | None, float | None]:
    """(utilization 0..1, memory used bytes) of GPU 0 through NVML, or (None, None)."""
    try:
        import pynvml  # noqa: PLC0415 (optional: only where a GPU driver exists)

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0, float(pynvml.nvmlDeviceGetMemoryInfo(h).used)
    except Exception:
        return None, None


def training(run: str, samples_per_s: float, step_seconds: float, loss: float, every_s: float = 10.0) -> bool:
    """Training progress (rank 0, at most every ``every_s``)."""
    if not gateway():
        return False
    import resource

    cpu = resource.getrusage(resource.RUSAGE_SELF)
    gpu_util, gpu_mem = _gpu()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return push("intentops-training", {"instance": os.uname().nodename}, {
        "intentops_training_samples_per_second": (samples_per_s, "training samples per second (last step)"),
        "intentops_training_step_seconds": (step_seconds, "seconds of the last optimizer step"),
        "intentops_training_loss": (loss, "training loss of the last step"),
        "intentops_training_cpu_seconds": (cpu.ru_utime + cpu.ru_stime, "CPU seconds of the training process"),
        "intentops_training_memory_bytes": (float(rss), "peak resident memory of the training process"),
        "intentops_memory_limit_bytes": (float(sysinfo.memory_limit_bytes()), "memory limit of the machine or cgroup"),
        "intentops_training_gpu_utilization": (gpu_util, "GPU 0 utilization, 0..1 (NVML)"),
        "intentops_training_gpu_memory_bytes": (gpu_mem, "GPU 0 memory used (NVML)"),
    }, labels={"run": run}, every_s=every_s)


def pipeline_run(dag_id: str, run_id: str, failed: bool, task_id: str = "") -> bool:
    """A run's outcome: ``intentops_pipeline_run_failed`` 1 (with the task) or 0; the
    group is per DAG, so the next good run clears a failure."""
    return push("intentops-pipeline", {"dag_id": dag_id}, {
        "intentops_pipeline_run_failed": (1.0 if failed else 0.0, "1 when the DAG's last run failed"),
        "intentops_pipeline_last_outcome_timestamp_seconds": (time.time(), "when the last run ended"),
    }, labels={"run_id": run_id, "task_id": task_id})


def champion_promoted(registered_model: str, version: str, at: float | None = None) -> bool:
    return push("intentops-deploy", {"registered_model": registered_model}, {
        "intentops_champion_promoted_timestamp_seconds": (at or time.time(), "when the champion was promoted"),
    }, labels={"version": str(version)})


DRIFT_STATUSES = ("drift", "no_drift", "too_little_traffic", "no_reference", "no_log")


def drift(dataset: str, status: str, figures: dict[str, float]) -> bool:
    """A monitoring check's verdict and figures (``ops/monitor.py``): ``intentops_drift_detected``
    1 or 0 (the drift alert) and each figure as ``intentops_drift_<name>``, all labelled
    with the check's ``status`` (``DRIFT_STATUSES``); the group is per dataset, so the next
    check replaces the last one."""
    gauges: dict[str, tuple[float, str]] = {
        "intentops_drift_detected": (1.0 if status == "drift" else 0.0,
                                     "1 when the last monitoring check found drift"),
        "intentops_drift_check_timestamp_seconds": (time.time(), "when the last monitoring check ran"),
    }
    for name, value in figures.items():
        if name != "drift":
            gauges[f"intentops_drift_{name}"] = (value, f"monitoring check figure {name}")
    return push("intentops-monitoring", {"dataset": dataset}, gauges, labels={"status": status})
