"""What a run costs: the resources each stage recorded, priced by the config's table.

Pure arithmetic over two inputs: a stage manifest's ``resources`` (``core.stage``'s
``ResourceMeter``: CPU core-seconds of the stage's process tree, GPU-seconds, peak
memory, bytes stored and read) and ``cfg.cost`` (``core.config.CostConfig``: instance
types with on-demand and spot prices, storage per GB-month, transfer per GB).

* **Compute**: instance-hours x the hourly price of the stage's instance type. With
  ``basis: share`` (the default) a stage occupies the share of the instance it used: the
  largest of CPU core-seconds / cores, GPU-seconds / GPUs and peak memory / instance memory
  x wall time; with ``basis: wall`` it holds the whole instance for its wall time.
* **Storage**: bytes the stage published, GB (2^30 bytes) x price per GB-month x months kept.
* **Transfer**: bytes the stage read (its inputs, where known) x price per GB.
* **Per 1,000 predictions** of a build: 1000 / rows-per-second (batch 32, from the export
  report) / 3600 x the serving instance's hourly price x the share of its cores the
  measurement used (the export's threads). It assumes the serving instance's cores are as
  fast as the cores that measured.

A run's total counts the stages that ran in it; a stage whose output the run reused (a
cache hit) cost its price when it was made, not again, and is listed apart.

Prices live in the config, outside every stage's key: a price change never reruns a stage.
"""

from __future__ import annotations

import math
from typing import Any

from core.config import CostConfig, InstanceType

GIB = 2**30
BUILDS = {"fp32": "onnx_fp32", "int8": "onnx_int8"}


def instances_cost(count: float, per_hour: float, hours: float) -> float:
    """``count`` instances at ``per_hour`` each for ``hours``."""
    return count * per_hour * hours


def hourly_price(itype: InstanceType, spot: bool) -> float:
    if spot:
        if itype.spot_per_hour is None:
            raise ValueError("spot price requested for an instance type without one")
        return itype.spot_per_hour
    return itype.on_demand_per_hour


def storage_cost(nbytes: float, per_gb_month: float, months: float) -> float:
    return nbytes / GIB * per_gb_month * months


def transfer_cost(nbytes: float, per_gb: float) -> float:
    return nbytes / GIB * per_gb


def instance_hours(res: dict[str, Any], itype: InstanceType, basis: str = "share") -> float:
    """The hours of one instance of ``itype`` a stage with resources ``res`` occupied."""
    wall = float(res.get("wall_seconds") or 0.0)
    if basis == "wall":
        return wall / 3600
    shares = [float(res.get("cpu_seconds") or 0.0) / itype.cores]
    if itype.gpus and res.get("gpu_seconds"):
        shares.append(float(res["gpu_seconds"]) / itype.gpus)
    if res.get("peak_rss_bytes"):
        shares.append(float(res["peak_rss_bytes"]) / GIB / itype.memory_gib * wall)
    return max(shares) / 3600


def stage_instance(cost: CostConfig, stage: str) -> str:
    return cost.stage_instances.get(stage, cost.pipeline_instance)


def cost_of(res: dict[str, Any], cost: CostConfig, stage: str = "") -> dict[str, Any]:
    """The cost of one stage output from its recorded resources."""
    name = stage_instance(cost, stage)
    itype = cost.instance_types[name]
    hourly = hourly_price(itype, cost.spot)
    hours = instance_hours(res, itype, cost.basis)
    compute = instances_cost(1, hourly, hours)
    storage = storage_cost(res.get("bytes_stored") or 0, cost.storage_per_gb_month, cost.storage_months)
    transfer = transfer_cost(res.get("bytes_read") or 0, cost.transfer_per_gb)
    return {"instance": name, "spot": cost.spot, "per_hour": hourly, "instance_hours": hours,
            "compute": compute, "storage": storage, "transfer": transfer,
            "total": compute + storage + transfer}


def per_1k_predictions(rows_per_s: float, threads: int | None, cost: CostConfig) -> float:
    """Serving cost of 1,000 predictions at ``rows_per_s`` measured with ``threads`` cores."""
    if not rows_per_s or rows_per_s <= 0:
        raise ValueError(f"rows per second must be positive, got {rows_per_s}")
    itype = cost.instance_types[cost.serving_instance]
    # The cores the measurement used, at the serving instance's price per core (more
    # threads than the instance has cores: the price of as many cores elsewhere).
    share = float(threads) / itype.cores if threads else 1.0
    return 1000 / rows_per_s / 3600 * hourly_price(itype, cost.serving_spot) * share


def run_cost(rows: list[dict[str, Any]], cost: CostConfig) -> dict[str, Any]:
    """The cost of a run from its summary rows (``core.runs.stage_row``: ``stage``,
    ``resources``, ``cache_hit`` and the export's figures)."""
    stages: dict[str, Any] = {}
    ran = reused = 0.0
    for r in rows:
        res = r.get("resources")
        if not res:  # published before resources were recorded
            stages[r["stage"]] = {"measured": False, "cache_hit": r.get("cache_hit")}
            continue
        c = cost_of(res, cost, r["stage"]) | {"measured": True, "cache_hit": bool(r.get("cache_hit")),
                                              "resources": res}
        stages[r["stage"]] = c
        if c["cache_hit"]:
            reused += c["total"]
        else:
            ran += c["total"]
    per_1k: dict[str, float] = {}
    exp = next((r for r in rows if r["stage"] == "export" and r.get("exported")), None)
    if exp:
        e = exp.get("export") or {}
        speeds = e.get("throughput_b32") or {}
        for build, key in BUILDS.items():
            if speeds.get(key):
                per_1k[build] = per_1k_predictions(speeds[key], e.get("threads"), cost)
    serving = cost.instance_types[cost.serving_instance]
    return {"currency": cost.currency, "basis": cost.basis, "total": ran, "reused": reused,
            "stages": stages, "per_1k_predictions": per_1k,
            "serving": {"instance": cost.serving_instance, "spot": cost.serving_spot,
                        "per_hour": hourly_price(serving, cost.serving_spot),
                        "threads": (exp.get("export") or {}).get("threads") if exp else None}}


def money(v: float) -> str:
    """Amounts for people: three significant digits below 1 (0.0000512), cents from 1,
    whole units with thousands separators from 100 (720,000)."""
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:,.2f}"
    digits = min(12, 2 - math.floor(math.log10(abs(v))))
    return f"{v:.{digits}f}".rstrip("0").rstrip(".")


def summary_line(rc: dict[str, Any]) -> str:
    """The summary's one ``cost`` line."""
    cur = rc["currency"]
    ran = [f"{s} {money(c['total'])}" for s, c in rc["stages"].items() if c.get("measured") and not c["cache_hit"]]
    reused = [s for s, c in rc["stages"].items() if c.get("measured") and c["cache_hit"]]
    unmeasured = [s for s, c in rc["stages"].items() if not c.get("measured")]
    line = f"cost {cur} {money(rc['total'])} this run"
    if ran:
        line += f" ({', '.join(ran)})"
    if reused:
        line += f"; reused {', '.join(reused)} (made for {money(rc['reused'])})"
    if unmeasured:
        line += f"; not measured: {', '.join(unmeasured)}"
    if rc["per_1k_predictions"]:
        sv = rc["serving"]
        builds = ", ".join(f"{b} {money(v)}" for b, v in rc["per_1k_predictions"].items())
        line += (f"; per 1,000 predictions {builds} ({sv['instance']} "
                 f"{'spot' if sv['spot'] else 'on-demand'} {sv['per_hour']:g}/h)")
    return line


def mlflow_metrics(rc: dict[str, Any]) -> dict[str, float]:
    """``cost_*`` metrics: the run's total, each measured stage's cost (what making its
    output cost) and the per-1,000-predictions figures."""
    m = {"cost_run_total": rc["total"], "cost_reused": rc["reused"]}
    for s, c in rc["stages"].items():
        if c.get("measured"):
            m[f"cost_stage_{s}"] = c["total"]
            m[f"cost_cpu_seconds_{s}"] = float(c["resources"].get("cpu_seconds") or 0.0)
    for b, v in rc["per_1k_predictions"].items():
        m[f"cost_per_1k_predictions_{b}"] = v
    return m
