"""Pipeline runs: the resolved config saved per run, and the per-stage run summary.

A run's folder, ``<lake>/runs/<run_id>/``, holds ``config.json`` (the resolved config),
one pointer per stage (``clean.json``, ``dedup.json``: which published output the run used)
and ``summary.json`` / ``summary.txt``. ``<lake>/runs/LATEST`` names the newest run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core import params, stages
from core.config import CostConfig, PipelineConfig, config_from_json, load_config
from core.stage import StageError, StageResult, atomic_write_text, run_dir, run_pointer

log = logging.getLogger(__name__)

STAGES = stages.NAMES  # the registry's order (core/stages.py)


class SettingsError(StageError):
    """A run's settings are invalid: an unknown trigger setting or a value out of bounds.
    Raised by ``resolve_run_config``, before any stage runs."""


class NoDataInInterval(StageError):
    """A scheduled run's data interval holds no date partition of the input: nothing to do."""


class NoNewData(StageError):
    """An asset-triggered run found nothing its stages have not read before: retraining on
    the same input would only repeat the last run. The run ends marked "no new data"."""


NO_NEW_DATA = "NO NEW DATA"
TRIGGER_FILE = "trigger.json"


def save_run_config(cfg: PipelineConfig, run_id: str) -> str:
    path = run_dir(cfg.lake, run_id) / "config.json"
    atomic_write_text(path, cfg.model_dump_json(indent=2))
    return str(path)


def resolve_run_config(run_id: str, conf: dict[str, Any] | None = None,
                       interval: tuple[Any, Any] | None = None) -> tuple[str, str | None]:
    """Resolve the run's config from the trigger form (``core.params``) over the YAML file
    and the environment, validate it and save it with the run. Returns the saved path and,
    for a run with a data ``interval`` (scheduled, backfill), a note on which days it reads.

    An asset-triggered run (no data interval) resolves through
    ``ops.triggers.resolve_triggered_run``, which calls this and then decides whether
    anything new arrived.

    Raises SettingsError for an unknown setting or an invalid value, NoDataInInterval when
    the input is date-partitioned and the interval holds no partition."""
    from core import partitions

    cfg = _form_config(conf or {})
    note = None
    if interval is not None:
        start, end = interval
        days = partitions.for_interval(cfg.resolve_path(cfg.input.path), start, end)
        if days == []:
            raise NoDataInInterval(f"{cfg.input.path}: no date partition in the data interval "
                                   f"[{start}, {end})")
        if days:
            cfg.input.partitions = days
        note = (f"[{start}, {end}): reads {', '.join(days)}" if days
                else f"[{start}, {end}): the input is not date-partitioned; reads all of it")
    return save_run_config(cfg, run_id), note


def _form_config(conf: dict[str, Any], base: dict[str, Any] | None = None) -> PipelineConfig:
    """The config a trigger form gives: its ``config_file`` (or the project's YAML), the
    environment, ``base`` (a saved run config) and the form's settings on top."""
    file = conf.get(params.CONFIG_FILE)
    if file:
        from core.config import PROJECT_ROOT

        file = Path(file) if Path(file).is_absolute() else PROJECT_ROOT / file
        if not file.is_file():
            raise SettingsError(f"config_file {conf[params.CONFIG_FILE]!r}: no such file")
    try:
        overrides = params.overrides(conf)
        return load_config(file, overrides={**base, **overrides} if base else overrides)
    except params.ParamError as exc:
        raise SettingsError(str(exc)) from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}"
                             for e in exc.errors())
        raise SettingsError(f"invalid settings: {problems}") from None
    except ValueError as exc:  # a YAML file that is not a mapping
        raise SettingsError(str(exc)) from None


SOURCE_RUN = "source_run"
EXPERIMENT_FILE = "experiment.json"
# Experiments train below the pipeline's default training.priority (1): any pipeline
# training that waits for the pool preempts a running experiment.
EXPERIMENT_PRIORITY = 0


def latest_curated_run(lake: Path) -> str | None:
    """The pipeline run whose label-QA output (the curated split) was published last."""
    found = [(p.stat().st_mtime, p.parent.name) for p in (lake / "runs").glob("*/labelqa.json")
             if not (p.parent / EXPERIMENT_FILE).exists()]
    return max(found)[1] if found else None


def resolve_experiment_config(run_id: str, conf: dict[str, Any] | None = None) -> tuple[str, str]:
    """An experiment run (``dags/intentops_experiment.py``): training alone, on the curated
    data of a finished pipeline run (``source_run``; empty: the newest with a label-QA
    output), with the form's settings over that run's saved config, at ``training.priority``
    ``EXPERIMENT_PRIORITY`` unless the form sets one. The source run's pointers up to label
    QA become this run's, so the train stage reads exactly that run's data; nothing past
    training (registry, export, serving) runs. Returns the saved config path and a note."""
    conf = dict(conf or {})
    source = str(conf.pop(SOURCE_RUN, None) or "").strip()
    if conf.get("training_priority") is None:
        conf["training_priority"] = EXPERIMENT_PRIORITY
    lake = _form_config(conf).lake
    source = source or latest_curated_run(lake) or ""
    src = run_dir(lake, source) if source else None
    if src is None or not (src / "labelqa.json").exists() or not (src / "config.json").exists():
        raise SettingsError(f"source_run {source!r}: no pipeline run of dataset {lake.name!r} with a "
                            "label-QA output" if source else
                            f"no pipeline run of dataset {lake.name!r} has reached label QA yet: "
                            "run the pipeline first")
    cfg = _form_config(conf, base=load_run_config(src / "config.json").model_dump(mode="json"))
    if cfg.training.nnodes_range[1] > 1 and not cfg.training.rdzv_endpoint:  # train_node tasks
        raise SettingsError("an experiment trains on the train task's node alone: set "
                            "training.nnodes to 1 (or a fixed training.rdzv_endpoint)")
    dest = run_dir(lake, run_id)
    dest.mkdir(parents=True, exist_ok=True)
    for name in STAGES[:STAGES.index("train")]:
        if (src / f"{name}.json").exists():
            atomic_write_text(dest / f"{name}.json", (src / f"{name}.json").read_text())
    atomic_write_text(dest / EXPERIMENT_FILE, json.dumps({"source_run": source}))
    return save_run_config(cfg, run_id), f"trains on the data of run {source} at priority {cfg.training.priority}"


def started_by(trigger: list[dict[str, Any]]) -> str:
    """One line on the asset events that started a run."""
    parts = []
    for ev in trigger:
        extra = ev.get("extra") or {}
        what = ev.get("asset") or extra.get("reason") or "asset"
        detail = "; ".join(extra.get("reasons") or []) or (
            f"{extra['feedback_labels']} feedback labels" if "feedback_labels" in extra else "")
        parts.append(f"{what}" + (f" ({detail})" if detail else "") + (f" from check {extra['check']}"
                                                                       if extra.get("check") else ""))
    return ", ".join(parts) or "an asset event"


def config_from_args(args: Any) -> PipelineConfig:
    """The config of a CLI or spark-submit invocation: ``--resolved-config`` (a run's saved
    config), else ``--config`` FILE; then ``--set KEY=VALUE`` overrides."""
    import yaml

    overrides: dict[str, Any] = {}
    if getattr(args, "resolved_config", None):
        if not args.set:
            return load_run_config(args.resolved_config)
        overrides = load_run_config(args.resolved_config).model_dump()
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise StageError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    try:
        return load_config(args.config, overrides)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SettingsError(f"invalid settings: {problems}") from None


def load_run_config(path: str | Path) -> PipelineConfig:
    p = Path(path)
    if not p.exists():
        raise StageError(f"resolved config not found: {p}")
    return config_from_json(p.read_text())


def stage_row(result: StageResult) -> dict[str, Any]:
    stats = result.manifest.get("stats", {})
    return {
        "stage": result.stage,
        "rows_in": stats.get("rows_in"),
        "kept": stats.get("kept"),
        "quarantined": stats.get("quarantined", 0),
        "quarantine_by_reason": stats.get("quarantine_by_reason", {}),
        "merged": stats.get("merged_exact", 0) + stats.get("merged_near", 0),
        "merged_exact": stats.get("merged_exact", 0),
        "merged_near": stats.get("merged_near", 0),
        "seconds": result.manifest.get("timings", {}).get("seconds"),
        "pii_entities": stats.get("entities", {}),
        "rows_with_pii": stats.get("rows_with_pii"),
        "gate_success": stats.get("success", stats.get("gate_passed")),
        "failed_expectations": stats.get("failed_expectations"),
        "suspects": stats.get("suspects"),
        "suspect_rate": stats.get("suspect_rate"),
        "krippendorff_alpha": stats.get("krippendorff_alpha"),
        "agreement_note": stats.get("agreement_note"),
        "conflict_rate": stats.get("conflict_rate"),
        "curated_by_split": stats.get("curated_by_split"),
        "mlflow_run_id": stats.get("mlflow_run_id"),
        "test_accuracy": stats.get("test_accuracy"),
        "test_macro_f1": stats.get("test_macro_f1"),
        "test_in_scope_accuracy": stats.get("test_in_scope_accuracy"),
        "test_oos_recall": stats.get("test_oos_recall"),
        "test_oos_precision": stats.get("test_oos_precision"),
        "reject_note": stats.get("reject_note"),
        "train_samples_per_s": stats.get("train_samples_per_s"),
        "registered": stats.get("registered"),
        "model_version": stats.get("version", stats.get("model_version")),
        "registration_reason": stats.get("reason"),
        "exported": stats.get("exported"),
        "export": {k: stats.get(k) for k in ("int8_status", "int8_reason", "sizes_mb", "accuracy",
                                             "p50_ms_b1", "throughput_b32", "ratios", "threads")},
        "deploy": {k: stats.get(k) for k in ("decision", "reason", "version", "stable_version",
                                             "client_requests", "client_failures", "fallbacks",
                                             "accuracy", "p99_ms", "seconds")} if "decision" in stats else None,
        "cache_hit": result.cache_hit,
        "output": result.path,
        "resources": result.manifest.get("resources"),
    }


def collect(lake: Path, run_id: str) -> list[dict[str, Any]]:
    rows = []
    for name in STAGES:
        pointer = run_pointer(lake, run_id, name)
        if pointer.exists():
            rows.append(stage_row(StageResult.from_file(pointer)))
    return rows


def stopped_by(rows: list[dict[str, Any]]) -> str | None:
    """What stopped the run, when a stage's verdict did (the summary's first line)."""
    for r in rows:
        if r.get("gate_success") is False:
            what = (f"{r['failed_expectations']} expectations failed" if r["stage"] == "validate"
                    else "label quality below the bar")
            return f"{r['stage']} gate failed ({what}); no model was trained"
        if r.get("registered") is False:
            return f"no model registered: {r['registration_reason']}"
        if r.get("deploy") and r["deploy"].get("decision") in ("rolled_back", "refused"):
            return f"deploy {r['deploy']['decision']}: {r['deploy']['reason']}"
    return None


def render(rows: list[dict[str, Any]], run_id: str, cost: CostConfig | None = None) -> str:
    """The summary text; with ``cost`` (the price table) it ends with the ``cost`` line."""
    head = f"{'stage':<11} {'rows in':>9} {'kept':>9} {'quarant.':>9} {'merged':>9} {'time s':>8}  cache"
    lines = [f"intentops run {run_id}"]
    stop = stopped_by(rows)
    if stop:
        lines.append(f"STOPPED: {stop}")
    lines += [head, "-" * len(head)]
    for r in rows:
        def n(v: Any) -> str:
            return f"{v:>9,}" if isinstance(v, int) else f"{'-':>9}"

        lines.append(
            f"{r['stage']:<11} {n(r['rows_in'])} {n(r['kept'])} {n(r['quarantined'])} "
            f"{n(r['merged'])} {r['seconds'] or 0:>8.1f}  {'hit' if r['cache_hit'] else 'miss'}"
        )
    for r in rows:
        if r["quarantine_by_reason"]:
            reasons = ", ".join(f"{k} {v:,}" for k, v in r["quarantine_by_reason"].items())
            lines.append(f"{r['stage']} quarantined by reason: {reasons}")
        if r["merged"]:
            lines.append(
                f"{r['stage']} merged: {r['merged_exact']:,} exact, {r['merged_near']:,} near-duplicates"
            )
        if r.get("pii_entities"):
            found = ", ".join(f"{k} {v:,}" for k, v in sorted(r["pii_entities"].items()))
            lines.append(f"{r['stage']}: {r['rows_with_pii']:,} rows with PII; masked {found}")
        if r.get("suspects") is not None:
            lines.append(
                f"{r['stage']}: {r['suspects']:,} suspect labels ({r['suspect_rate']:.2%}) in the relabel "
                f"queue; alpha {r['krippendorff_alpha'] if r['krippendorff_alpha'] is not None else r.get('agreement_note') or 'skipped'}; "
                f"dedup-conflict rate {r.get('conflict_rate')}; curated {r['curated_by_split']}; "
                f"report {r['output']}/qa_report.html; MLflow run {r['mlflow_run_id']}"
            )
        elif r.get("test_accuracy") is not None:
            lines.append(
                f"{r['stage']}: test accuracy {r['test_accuracy']:.4f}, macro-F1 {r['test_macro_f1']:.4f}, "
                f"{(r['train_samples_per_s'] or 0):.1f} train samples/s; MLflow run {r['mlflow_run_id']}"
            )
            if r.get("reject_note"):
                oos = (f"; out-of-scope recall {r['test_oos_recall']:.4f}"
                       if r.get("test_oos_recall") is not None else "")
                ins = (f"in-scope accuracy {r['test_in_scope_accuracy']:.4f} with the reject rule{oos}; "
                       if r.get("test_in_scope_accuracy") is not None else "")
                lines.append(f"{r['stage']}: {ins}{r['reject_note']}")
        elif r.get("deploy"):
            lines.extend(render_deploy(r))
        elif r.get("exported") is not None:
            lines.extend(render_export(r))
        elif r.get("registered") is not None:
            verdict = (f"registered as version {r['model_version']} (alias challenger)" if r["registered"]
                       else "REJECTED")
            lines.append(f"{r['stage']}: {verdict}: {r['registration_reason']}")
        elif r.get("gate_success") is not None:
            verdict = "passed" if r["gate_success"] else f"FAILED ({r['failed_expectations']} expectations)"
            lines.append(f"{r['stage']}: gate {verdict}; Data Docs {r['output']}/data_docs/index.html")
    if cost is not None and rows:
        from core import cost as pricing

        lines.append(pricing.summary_line(pricing.run_cost(rows, cost)))
    return "\n".join(lines)


def render_export(r: dict[str, Any]) -> list[str]:
    if not r["exported"]:
        return [f"{r['stage']}: skipped: {r['registration_reason']}"]
    e = r["export"]
    out = [f"{r['stage']}: model version {r['model_version']}, int8 build {e['int8_status'].upper()} "
           f"({e['int8_reason']}); report {r['output']}/report.md"]
    for b in ("pytorch_eager", "onnx_fp32", "onnx_int8"):
        out.append(f"  {b:<14} {e['sizes_mb'][b]:>7.1f} MB  p50 b1 {e['p50_ms_b1'][b]:>7.2f} ms  "
                   f"b32 {e['throughput_b32'][b]:>7.0f} rows/s  accuracy {e['accuracy'][b]:.4f}")
    ra = e["ratios"]
    out.append(f"  int8: {ra['int8_speedup_vs_eager_b1']:.2f}x eager at batch 1, "
               f"{ra['int8_throughput_vs_fp32_b32']:.2f}x fp32 at batch 32, "
               f"{ra['int8_size_share_of_fp32']:.1%} of fp32 size")
    return out


def render_deploy(r: dict[str, Any]) -> list[str]:
    d = r["deploy"]
    if d["decision"] == "skipped":
        return [f"{r['stage']}: skipped: {d['reason']}"]
    out = [f"{r['stage']}: version {d['version']} {d['decision'].upper()}: {d['reason']}"]
    if d.get("client_requests") is not None:
        acc = d.get("accuracy") or {}
        p99 = d.get("p99_ms") or {}

        def f(v: Any, fmt: str) -> str:
            return format(v, fmt) if isinstance(v, (int, float)) else "-"

        out.append(f"  {d['client_requests']:,} probe requests through the router, {d['client_failures']} failed, "
                   f"{d['fallbacks']} canary failures retried on stable, {f(d.get('seconds'), '.0f')} s; "
                   f"accuracy canary {f(acc.get('canary'), '.3f')} stable {f(acc.get('stable'), '.3f')}; "
                   f"p99 canary {f(p99.get('canary'), '.1f')} ms stable {f(p99.get('stable'), '.1f')} ms; "
                   f"chart {r['output']}/rollout.png")
    return out


def write_summary(config_path: str | Path, run_id: str) -> str:
    cfg = load_run_config(config_path)
    rows = collect(cfg.lake, run_id)
    folder = run_dir(cfg.lake, run_id)
    experiment = None
    if (folder / EXPERIMENT_FILE).exists():  # its data stages are the source run's: not its work
        experiment = json.loads((folder / EXPERIMENT_FILE).read_text())
        rows = [r for r in rows if STAGES.index(r["stage"]) >= STAGES.index("train")]
    if not rows:
        raise StageError(f"run {run_id!r} has no stage outputs under {cfg.lake}")
    text = render(rows, run_id, cfg.cost)
    if experiment is not None:
        head, _, rest = text.partition("\n")
        text = f"{head}\nexperiment on the data of run {experiment['source_run']}\n{rest}"
    trigger = None
    if (folder / TRIGGER_FILE).exists():
        trigger = json.loads((folder / TRIGGER_FILE).read_text())
        head, _, rest = text.partition("\n")
        text = f"{head}\nstarted by {started_by(trigger)}\n{rest}"
    log.info("\n%s", text)
    from core import cost as pricing

    atomic_write_text(
        folder / "summary.json",
        json.dumps({"run_id": run_id, "stages": rows, "cost": pricing.run_cost(rows, cfg.cost),
                    **({"trigger": trigger} if trigger is not None else {}),
                    **({"experiment": experiment} if experiment is not None else {})},
                   indent=2, default=str),
    )
    atomic_write_text(folder / "summary.txt", text + "\n")
    if experiment is None:  # LATEST names the newest pipeline run
        atomic_write_text(cfg.lake / "runs" / "LATEST", folder.name + "\n")
    return str(folder / "summary.json")


def latest_summary(lake: Path) -> str:
    latest = lake / "runs" / "LATEST"
    if not latest.exists():
        raise StageError(f"no finished run under {lake} yet")
    return (lake / "runs" / latest.read_text().strip() / "summary.txt").read_text()


LABELS_FILE = "labels.json"


def run_labels_file(lake: Path, run_id: str) -> Path:
    """The run's label set as the clean stage published it (from ``clean.labels_file`` or
    inferred from the data): the one list every later stage and the model use."""
    from core.stage import upstream

    path = Path(upstream(lake, run_id, "clean").path) / LABELS_FILE
    if not path.exists():
        raise StageError(f"{path.parent} has no {LABELS_FILE}: rerun the clean stage")
    return path


def run_labels(lake: Path, run_id: str) -> list[str]:
    return json.loads(run_labels_file(lake, run_id).read_text())
