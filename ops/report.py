"""The run report: one self-contained HTML page per pipeline run.

Built from what the run recorded (``<lake>/runs/<run_id>/``: the stage pointers that
``core.runs.collect`` reads, then each stage's own files): rows in and out per stage,
quarantine reasons, PII counts by type with masked samples, the validation gate's result,
the label-QA findings, training curves, the export comparison and the canary timeline with
its decision. A stage the run never reached (it stopped at a gate, or a task failed) shows
as *not run*, with the failure when it is known, so a failed run gets its report too.

Charts are PNG data URIs and the style is inline: the page needs no network, so it opens
from the lake, from the Airflow UI and as an MLflow artifact alike. It is downstream of
desensitization and quotes numbers and the desensitize stage's masked samples only.

Two renderings of the same page:

* ``<lake>/runs/<run_id>/report.html``, served by the Airflow plugin
  (``plugins/intentops_reports.py``, ``/intentops/runs/<run_id>/report``); its links to
  stage artifacts (Data Docs, the QA report) are relative to that route;
* the copy logged to the run of the registered model version
  (``report/<run_id>/report.html``, version tag ``intentops.report.artifact``), where those
  links would not resolve: it names the artifacts instead of linking them.

By hand::

    .venv/bin/python -m ops.report --run-id <run_id>     # config: the run's config.json
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from core import stage
from core.config import PipelineConfig
from core.runs import NO_NEW_DATA, STAGES, TRIGGER_FILE, collect, load_run_config, started_by

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
ARTIFACT_TAG = "intentops.report.artifact"
# Where the Airflow plugin serves a stage's files, relative to the report's own URL
# (``/intentops/runs/<run_id>/report``): ``files/<stage>/<path>``.
FILES_ROUTE = "files"
# The files the plugin may serve per stage, and so the only ones the report links. The
# raw zone (clean, dedup) holds personal data and is never served.
SERVED_FILES: dict[str, tuple[str, ...]] = {
    "desensitize": ("report.json",),
    "validate": ("validation_result.json", "data_docs/"),
    "labelqa": ("qa_report.html", "metrics.json", "relabel_queue.csv", "relabel_queue.json",
                "label_studio_config.xml"),
    # The round's items are label QA's masked queue rows, with their Label Studio task ids.
    "review": ("push.json", "sent.csv"),
    "train": ("metrics.json", "history.jsonl", "classification_report.json", "confusion_matrix.png"),
    "register": ("behaviour.json", "decision.json"),
    "export": ("report.md", "report.json", "speed.png"),
    "deploy": ("rollout.json", "rollout.png"),
}
TITLES = {"clean": "Clean", "dedup": "Deduplicate", "desensitize": "Desensitize",
          "validate": "Validation gate", "labelqa": "Label QA", "review": "Review (Label Studio)",
          "train": "Training",
          "register": "Registration", "export": "Export", "deploy": "Canary deployment"}
# Airflow task states that mean the stage's task did not succeed.
_FAILED_STATES = {"failed": "the task failed before it published an output; see its log",
                  "upstream_failed": "not run: an upstream stage failed",
                  "skipped": "skipped", "removed": "removed"}


def servable(stage_name: str, rel: str) -> bool:
    """Whether the plugin may serve ``rel`` (a relative POSIX path) of ``stage_name``'s
    output; the same rule decides which links the report emits."""
    allowed = SERVED_FILES.get(stage_name, ())
    return any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in allowed)


@dataclass
class StageView:
    name: str
    row: dict[str, Any] | None  # core.runs.stage_row, None when the stage did not run
    status: str  # ok | failed | rejected | skipped | not run
    note: str = ""

    @property
    def out(self) -> Path | None:
        return Path(self.row["output"]) if self.row else None

    def json(self, name: str) -> Any:
        p = self.out / name if self.out else None
        return json.loads(p.read_text()) if p and p.is_file() else None


@dataclass
class Report:
    run_id: str
    stages: dict[str, StageView]
    config: dict[str, Any] = field(default_factory=dict)
    dataset: str = ""
    cost: dict[str, Any] = field(default_factory=dict)  # core.cost.run_cost
    started_by: str = ""  # an asset-triggered run: the events that started it (core.runs.started_by)

    @property
    def verdict(self) -> str:
        bad = [s for s in self.stages.values() if s.status in ("failed", "rejected")]
        if bad:
            return f"stopped at {bad[0].name}: {bad[0].note}" if bad[0].note else f"failed at {bad[0].name}"
        missing = [s.name for s in self.stages.values() if s.status == "not run"]
        if missing:
            return f"incomplete: {', '.join(missing)} not run"
        return "every stage ran"


# --------------------------------------------------------------------------- gathering


def _status(name: str, row: dict[str, Any] | None, state: str | None) -> tuple[str, str]:
    if row is None and name == "review" and state in (None, "skipped"):
        # Optional: without a Label Studio the push skips (its log says why); not a gap.
        return "skipped", "nothing sent to Label Studio (none configured, or turned off: see the task's log)"
    if row is None:
        if state in _FAILED_STATES:
            return ("failed" if state == "failed" else "not run"), _FAILED_STATES[state]
        return "not run", "the run published no output for this stage"
    if name in ("validate", "labelqa") and row.get("gate_success") is False:
        return "failed", "gate failed"
    if name == "register" and row.get("registered") is False:
        return "rejected", row.get("registration_reason") or ""
    if name == "export" and row.get("exported") is False:
        return "skipped", row.get("registration_reason") or ""
    e = row.get("export") or {}
    if name == "export" and e.get("int8_status") == "failed":
        return "ok", f"the int8 build failed its gate ({e.get('int8_reason')}); serving refuses it"
    d = row.get("deploy")
    if name == "deploy" and d:
        if d["decision"] in ("rolled_back", "refused"):
            return "failed", f"{d['decision']}: {d.get('reason')}"
        if d["decision"] == "skipped":
            return "skipped", d.get("reason") or ""
    return "ok", ""


def gather(cfg: PipelineConfig, run_id: str, task_states: dict[str, str] | None = None) -> Report:
    """Everything the page shows, from the run's pointers (``runs.collect``) and the stage
    outputs they name. ``task_states`` (task id -> Airflow state) says why a stage that
    published nothing did not run."""
    from core import cost as pricing

    listed = collect(cfg.lake, run_id)
    rows = {r["stage"]: r for r in listed}
    views: dict[str, StageView] = {}
    for name in STAGES:
        status, note = _status(name, rows.get(name), (task_states or {}).get(name))
        views[name] = StageView(name, rows.get(name), status, note)
    v = views["validate"]
    if v.status == "failed":
        res = v.json("validation_result.json") or {}
        v.note = "; ".join(res.get("failures") or []) or "the validation gate failed"
    q = views["labelqa"]
    if q.status == "failed":
        gate = (q.json("metrics.json") or {}).get("gate") or {}
        bad = [c for c in gate.get("checks", []) if c.get("passed") is False]
        q.note = "; ".join(f"{c['name']}: {c['value']} (threshold {c['threshold']})" for c in bad) \
            or "the label-QA gate failed"
    c = cfg.model_dump(mode="json")
    config = {
        "dataset / registered model": f"{c['dataset']} / {c['training']['registered_model']}",
        "clean.label_set": (c["clean"]["labels_file"] if c["clean"]["label_set"] == "file"
                            else f"inferred (min {c['clean']['min_class_count']} rows per label)"),
        "clean.min_chars / max_chars": f"{c['clean']['min_chars']} / {c['clean']['max_chars']}",
        "dedup.threshold": c["dedup"]["threshold"],
        "desensitize.mode": c["desensitize"]["mode"],
        "validation.max_duplicate_rate": c["validation"]["max_duplicate_rate"],
        "validation.max_residual_pii_rate": c["validation"]["max_residual_pii_rate"],
        "labelqa.min_alpha / max_suspect_rate": f"{c['labelqa']['min_alpha']} / {c['labelqa']['max_suspect_rate']}",
        "labelqa.suspects": c["labelqa"]["suspects"],
        "training.hparams": json.dumps(c["training"]["hparams"], sort_keys=True),
        "training.metric / margin": f"{c['training']['metric']} / {c['training']['margin']}",
        "deploy.steps / bake_seconds": f"{c['deploy']['steps']} / {c['deploy']['bake_seconds']}",
    }
    trigger = stage.run_dir(cfg.lake, run_id) / TRIGGER_FILE
    started = started_by(json.loads(trigger.read_text())) if trigger.exists() else ""
    return Report(run_id, views, config, cfg.dataset, pricing.run_cost(listed, cfg.cost), started)


def _history(view: StageView) -> list[dict[str, Any]]:
    p = view.out / "history.jsonl" if view.out else None
    if not p or not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- charts


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _file_png(path: Path | None) -> str | None:
    if path is None or not path.is_file():
        return None
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def charts(rep: Report) -> dict[str, str]:
    """chart id -> PNG data URI, for the charts the run's outputs allow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    st = rep.stages
    flow = [(n, st[n].row) for n in ("clean", "dedup", "desensitize", "validate", "labelqa")
            if st[n].row and isinstance(st[n].row.get("rows_in"), int)]
    if flow:
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(flow) + 1.2))
        names = [n for n, _ in flow][::-1]
        rin = [r["rows_in"] for _, r in flow][::-1]
        kept = [r["kept"] or 0 for _, r in flow][::-1]
        y = range(len(names))
        ax.barh([i + 0.2 for i in y], rin, height=0.4, color="#9aa5b1", label="rows in")
        ax.barh([i - 0.2 for i in y], kept, height=0.4, color="#4c72b0", label="kept")
        ax.set_yticks(list(y), names)
        ax.set_xlabel("rows")
        ax.set_title("Rows in and kept per stage")
        ax.legend(loc="lower right", fontsize=8)
        out["chart-rows"] = _png(fig)
    def counts_chart(counts: dict[str, int], color: str, xlabel: str, title: str) -> str:
        items = sorted(counts.items(), key=lambda kv: kv[1])
        fig, ax = plt.subplots(figsize=(7, 0.3 * len(items) + 1.2))
        ax.barh([k for k, _ in items], [v for _, v in items], color=color)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        return _png(fig)

    reasons = (st["clean"].row or {}).get("quarantine_by_reason") or {}
    if reasons:
        out["chart-quarantine"] = counts_chart(reasons, "#c44e52", "rows quarantined", "Quarantine by reason")
    pii = (st["desensitize"].row or {}).get("pii_entities") or {}
    if pii:
        out["chart-pii"] = counts_chart(pii, "#8172b2", "entities masked", "PII masked by type")
    hist = _history(st["train"])
    if hist:
        steps = [h["step"] for h in hist]
        fig, ax = plt.subplots(2, 1, figsize=(7, 4.6), sharex=True)
        ax[0].plot(steps, [h["loss"] for h in hist], color="#4c72b0")
        ax[0].set_ylabel("training loss")
        ax[0].set_title("Training loss and learning rate per optimizer step")
        ax[1].plot(steps, [h["lr"] for h in hist], color="#dd8452")
        ax[1].set_ylabel("learning rate")
        ax[1].set_xlabel("step")
        out["chart-train-loss"] = _png(fig)
    val = ((st["train"].json("metrics.json") or {}).get("val_history")) or []
    if val:
        fig, ax = plt.subplots(figsize=(7, 3))
        steps = [v["step"] for v in val]
        for key, colour in (("accuracy", "#55a868"), ("macro_f1", "#4c72b0")):
            ax.plot(steps, [v.get(key) for v in val], marker="o", color=colour, label=f"val {key}")
        ax.set_ylim(0, 1)
        ax.set_xlabel("step")
        ax2 = ax.twinx()
        ax2.plot(steps, [v.get("loss") for v in val], marker="s", linestyle="--", color="#c44e52",
                 label="val loss")
        ax2.set_ylabel("val loss")
        ax.set_title("Validation metrics at each evaluation")
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="lower left")
        out["chart-train-val"] = _png(fig)
    cm = _file_png(st["train"].out / "confusion_matrix.png" if st["train"].out else None)
    if cm:
        out["chart-confusion"] = cm
    builds = ((st["export"].json("report.json") or {}).get("builds")) or {}
    if builds:
        names = list(builds)
        colours = ["#9aa5b1", "#55a868", "#4c72b0"][: len(names)]
        fig, axes = plt.subplots(1, 4, figsize=(12, 3.2))
        panels = (("size_mb", "size (MB)"), ("p50_ms_b1", "batch-1 latency p50 (ms)"),
                  ("throughput_b32", "batch-32 throughput (rows/s)"), ("accuracy", "test accuracy"))
        for ax, (key, title) in zip(axes, panels, strict=True):
            vals = [builds[n][key] for n in names]
            ax.bar(names, vals, color=colours)
            ax.set_title(title, fontsize=9)
            ax.tick_params(axis="x", labelsize=7, rotation=20)
            for i, v in enumerate(vals):
                ax.text(i, v, f"{v:,.0f}" if v >= 100 else f"{v:.3g}", ha="center", va="bottom", fontsize=7)
        if all("p99_ms_b1" in builds[n] for n in names):
            # p99 can be 100x p50 (a GC pause in eager mode): a log axis keeps both readable.
            axes[1].scatter(names, [builds[n]["p99_ms_b1"] for n in names], color="black", marker="_",
                            s=300, label="p99", zorder=3)
            axes[1].set_yscale("log")
            axes[1].set_title("batch-1 latency p50 (bars), p99 (ms)", fontsize=9)
            axes[1].legend(fontsize=7)
        fig.suptitle("PyTorch eager against ONNX Runtime fp32 and int8", fontsize=10)
        fig.tight_layout()
        out["chart-export"] = _png(fig)
    rollout = st["deploy"].json("rollout.json") or {}
    timeline = rollout.get("timeline") or []
    if timeline:
        out["chart-canary"] = _canary_chart(timeline, rollout.get("events") or [], rollout.get("decision", ""))
    return out


def _canary_chart(timeline: list[dict[str, Any]], events: list[dict[str, Any]], decision: str) -> str:
    import matplotlib.pyplot as plt

    def series(key: str, scale: float = 1.0) -> list[float]:
        return [p[key] * scale if p.get(key) is not None else float("nan") for p in timeline]

    t = [p["t"] for p in timeline]
    fig, ax = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    ax[0].step(t, series("weight", 100), where="post", color="black")
    ax[0].set_ylabel("canary traffic %")
    ax[0].set_ylim(0, 105)
    ax[0].set_title(f"Canary rollout: {decision}")
    for e in events:
        for a in ax:
            a.axvline(e["t"], color="#bbb", linestyle=":", linewidth=1)
    for key, lab in (("canary_p50_ms", "canary p50"), ("canary_p99_ms", "canary p99"),
                     ("stable_p99_ms", "stable p99")):
        ax[1].plot(t, series(key), label=lab)
    ax[1].set_ylabel("latency ms")
    ax[1].legend(fontsize=8)
    for key, lab in (("canary_error_rate", "canary errors"), ("agreement", "shadow agreement"),
                     ("canary_accuracy", "canary accuracy"), ("stable_accuracy", "stable accuracy")):
        ax[2].plot(t, series(key, 100), label=lab)
    ax[2].set_ylabel("%")
    ax[2].set_xlabel("seconds since the rollout started")
    ax[2].legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


# --------------------------------------------------------------------------- rendering

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1100px;
padding:1rem 2rem;color:#1f2933}
h1{font-size:1.5rem}h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f5f7}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37}.failed,.rejected{color:#cf222e;font-weight:bold}.skipped,.notrun{color:#9a6700}
figure{margin:.5rem 0 1rem}figure img{max-width:100%;height:auto}
code{background:#f3f5f7;padding:0 .2rem}nav ol{columns:2}
.note{background:#fff8c5;border:1px solid #d4a72c;padding:.4rem .6rem}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items())
    return str(v)


def _table(rows: list[list[Any]], head: list[str], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{_e(_fmt(c))}</td>"
                         for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _kv(pairs: list[tuple[str, Any]]) -> str:
    return _table([[k, v] for k, v in pairs if v is not None], ["figure", "value"])


def _figure(figs: dict[str, str], fid: str, caption: str, max_px: int | None = None) -> str:
    if fid not in figs:
        return ""
    style = f' style="max-width:{max_px}px"' if max_px else ""
    return (f'<figure id="{fid}"><img src="{figs[fid]}" alt="{_e(caption)}"{style}>'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


class _Links:
    """Links to stage files: relative to the plugin route (``mode="airflow"``) or, where
    they would not resolve (the MLflow copy), the file named in place of a link."""

    def __init__(self, rep: Report, mode: str):
        self.rep, self.mode = rep, mode

    def __call__(self, stage_name: str, rel: str, text: str) -> str:
        view = self.rep.stages[stage_name]
        if view.out is None or not (view.out / rel).is_file() or not servable(stage_name, rel):
            return _e(text) + " (not available)"
        where = f"{stage_name}/{view.out.name}/{rel}"
        if self.mode == "airflow":
            href = f"{FILES_ROUTE}/{quote(stage_name)}/{quote(rel)}"
            return f'<a href="{_e(href)}">{_e(text)}</a> <code>{_e(where)}</code>'
        return f"{_e(text)}: <code>{_e(where)}</code> in the lake (linked from the run report in Airflow)"


def _status_cell(v: StageView) -> str:
    cls = v.status.replace(" ", "")
    return f'<span class="{cls}">{_e(v.status)}</span>'


def _overview(rep: Report, figs: dict[str, str]) -> str:
    rows = []
    for v in rep.stages.values():
        r = v.row or {}
        cells = [r.get("rows_in"), r.get("kept"), r.get("quarantined") if v.name == "clean" else None,
                 r.get("merged") if v.name == "dedup" else None, r.get("seconds")]
        tds = "".join(f"<td class=n>{_e(_fmt(c))}</td>" for c in cells)
        cache = "" if not v.row else ("hit" if r.get("cache_hit") else "miss")
        rows.append(f'<tr><td><a href="#stage-{v.name}">{_e(v.name)}</a></td><td>{_status_cell(v)}</td>'
                    f"{tds}<td>{cache}</td><td>{_e(v.note)}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("stage", "status", "rows in", "kept", "quarantined",
                                               "merged", "seconds", "cache", "note"))
    return (f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            + _figure(figs, "chart-rows", "Rows in and kept per data stage"))


def _mb(v: Any) -> float | None:
    return None if v is None else v / 1e6


def _cost(rep: Report) -> str:
    """The cost table: each stage's recorded resources and what they cost at the price
    table's prices, the run's total and the per-1,000-predictions figures."""
    rc = rep.cost
    if not rc or not rc.get("stages"):
        return "<p>No stage published an output: nothing to price.</p>"
    from core.cost import money

    cur = rc["currency"]
    rows = []
    for name, c in rc["stages"].items():
        if not c.get("measured"):
            rows.append([name, "not measured (published before resources were recorded)"] + [None] * 11)
            continue
        r = c["resources"]
        rows.append([name, "reused" if c["cache_hit"] else "ran",
                     f"{c['instance']} {'spot' if c['spot'] else 'on-demand'}",
                     r.get("cpu_seconds"), r.get("gpu_seconds"), _mb(r.get("peak_rss_bytes")),
                     _mb(r.get("bytes_stored")), _mb(r.get("bytes_read")), c["instance_hours"] * 3600,
                     money(c["compute"]), money(c["storage"]), money(c["transfer"]), money(c["total"])])
    head = ["stage", "in this run", "instance", "CPU core-s", "GPU-s", "peak memory MB", "stored MB",
            "read MB", "instance-seconds", f"compute {cur}", f"storage {cur}", f"transfer {cur}", f"total {cur}"]
    out = [_table(rows, head, set(range(3, 13)))]
    gpus = any((c.get("resources") or {}).get("gpus") for c in rc["stages"].values())
    pairs: list[tuple[str, Any]] = [
        (f"this run ({cur}; the stages that ran)", money(rc["total"])),
        (f"reused outputs, when they were made ({cur})", money(rc["reused"])),
        ("basis", "share of the instance used" if rc["basis"] == "share" else "whole instance for the wall time"),
        ("GPU", "used" if gpus else "no GPU on the machine that ran the stages")]
    sv = rc["serving"]
    for build, v in rc["per_1k_predictions"].items():
        pairs.append((f"per 1,000 predictions, {build} build ({cur})", money(v)))
    if rc["per_1k_predictions"]:
        pairs.append(("serving instance", f"{sv['instance']} {'spot' if sv['spot'] else 'on-demand'} "
                      f"{sv['per_hour']:g} {cur}/h; measured with {sv['threads']} thread(s) at batch 32"))
    out.append(_kv(pairs))
    out.append("<p>Prices from the run's <code>cost</code> settings; the defaults are example prices.</p>")
    return "".join(out)


def _section_body(rep: Report, v: StageView, figs: dict[str, str], link: _Links) -> str:
    if v.row is None:
        return f'<p class="notrun">Not run: {_e(v.note)}.</p>'
    r = v.row
    parts: list[str] = []
    if v.name == "clean":
        parts.append(_kv([("rows in", r["rows_in"]), ("kept", r["kept"]), ("quarantined", r["quarantined"])]))
        reasons = r.get("quarantine_by_reason") or {}
        if reasons:
            parts.append("<h3>Quarantine reasons</h3>" + _table(
                [[k, n] for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])], ["reason", "rows"], {1}))
            parts.append(_figure(figs, "chart-quarantine", "Rows quarantined by reason"))
    elif v.name == "dedup":
        parts.append(_kv([("rows in", r["rows_in"]), ("kept (one survivor per cluster)", r["kept"]),
                          ("merged as exact duplicates", r["merged_exact"]),
                          ("merged as near-duplicates", r["merged_near"])]))
    elif v.name == "desensitize":
        parts.append(_desensitize(v, figs, link))
    elif v.name == "validate":
        parts.append(_validate(v, link))
    elif v.name == "labelqa":
        parts.append(_labelqa(v, link))
    elif v.name == "review":
        push = v.json("push.json") or {}
        parts.append(_kv([("project", push.get("project")), ("round", push.get("round")),
                          ("items sent", push.get("sent")),
                          ("already in Label Studio", push.get("already_in_label_studio")),
                          ("already reviewed", push.get("already_reviewed")),
                          ("left for later rounds", push.get("left_for_next_rounds"))]))
        parts.append(f"<p>{link('review', 'sent.csv', 'Items sent')}</p>")
    elif v.name == "train":
        parts.append(_train(v, figs, link))
    elif v.name == "register":
        parts.append(_register(v, link))
    elif v.name == "export":
        parts.append(_export(v, figs, link))
    elif v.name == "deploy":
        parts.append(_deploy(v, figs, link))
    return "".join(parts)


def _desensitize(v: StageView, figs: dict[str, str], link: _Links) -> str:
    r = v.row
    rep = v.json("report.json") or {}
    out = [_kv([("rows in (kept and merged)", r["rows_in"]), ("rows with PII", r.get("rows_with_pii"))])]
    ents = r.get("pii_entities") or {}
    parts = rep.get("parts") or {}
    rows = [[k, n, (parts.get("kept") or {}).get("entities", {}).get(k, 0),
             (parts.get("merged") or {}).get("entities", {}).get(k, 0)]
            for k, n in sorted(ents.items(), key=lambda kv: -kv[1])]
    out.append("<h3>PII masked by type</h3>" + _table(rows, ["type", "entities", "in kept", "in merged"],
                                                        {1, 2, 3}))
    out.append(_figure(figs, "chart-pii", "Entities masked by type"))
    samples = rep.get("masked_samples") or {}
    if samples:
        items = "".join(f"<tr><td>{_e(k)}</td><td>{'<br>'.join(_e(s) for s in ss)}</td></tr>"
                        for k, ss in sorted(samples.items()))
        out.append("<h3>Masked samples</h3><p>Texts after masking, as the stage published them.</p>"
                   f"<table><thead><tr><th>type</th><th>masked text</th></tr></thead><tbody>{items}</tbody></table>")
    out.append(f"<p>{link('desensitize', 'report.json', 'Stage report (counts, masked samples)')}</p>")
    return "".join(out)


def _validate(v: StageView, link: _Links) -> str:
    res = v.json("validation_result.json") or {}
    ok = res.get("success", v.row.get("gate_success"))
    out = [f"<p>Great Expectations gate: <b class=\"{'ok' if ok else 'failed'}\">"
           f"{'PASSED' if ok else 'FAILED'}</b> on {_fmt(res.get('row_count'))} rows; "
           f"{_fmt(v.row.get('failed_expectations'))} failed expectations.</p>"]
    for f in res.get("failures") or []:
        out.append(f'<p class="note">{_e(f)}</p>')
    rows = []
    for e in res.get("expectations") or []:
        rows.append([e.get("check"), e.get("type"), e.get("column"), "passed" if e.get("success") else "FAILED",
                     e.get("element_count"), e.get("unexpected_count"), e.get("unexpected_percent")])
    for s in res.get("skipped") or []:
        rows.append([s.get("check"), s.get("type"), s.get("column"), f"skipped: {s.get('reason')}",
                     None, None, None])
    if rows:
        out.append(_table(rows, ["check", "expectation", "column", "result", "rows", "unexpected",
                                 "unexpected %"], {4, 5, 6}))
    out.append(f"<p>{link('validate', 'data_docs/index.html', 'Data Docs')}</p>")
    return "".join(out)


def _labelqa(v: StageView, link: _Links) -> str:
    r = v.row
    m = v.json("metrics.json") or {}
    a = m.get("agreement") or {}
    out = [_kv([("items", r["rows_in"]), ("suspect labels (relabel queue)", r.get("suspects")),
                ("suspect rate", r.get("suspect_rate")), ("Krippendorff's alpha", r.get("krippendorff_alpha")),
                ("Fleiss' kappa", a.get("fleiss_kappa")), ("cleanlab issues", m.get("cleanlab_issues")),
                ("consensus", m.get("consensus_method")), ("curated rows", r.get("kept")),
                ("curated split", r.get("curated_by_split")), ("MLflow data-quality run", r.get("mlflow_run_id"))])]
    gate = m.get("gate") or {}
    if gate.get("checks"):
        out.append("<h3>Gate</h3>" + _table(
            [[c["name"], c["value"], c["threshold"],
              "pass" if c["passed"] else ("skipped" if c["passed"] is None else "FAIL"), c.get("note")]
             for c in gate["checks"]], ["check", "value", "threshold", "result", "note"]))
    by_class = m.get("suspects_by_class") or {}
    if by_class:
        top = sorted(by_class.items(), key=lambda kv: -kv[1])[:10]
        out.append("<h3>Classes with the most suspects</h3>" + _table([list(t) for t in top],
                                                                       ["class", "suspects"], {1}))
    out.append(f"<p>{link('labelqa', 'qa_report.html', 'Label-QA report')}; "
               f"{link('labelqa', 'relabel_queue.csv', 'relabel queue')}</p>")
    return "".join(out)


def _train(v: StageView, figs: dict[str, str], link: _Links) -> str:
    r = v.row
    m = v.json("metrics.json") or {}
    out = [_kv([("model", m.get("model")), ("processes (world size)", m.get("world_size")),
                ("optimizer steps", m.get("steps")), ("stop reason", m.get("stop_reason")),
                ("best epoch", m.get("best_epoch")), ("test accuracy", r.get("test_accuracy")),
                ("test macro-F1", r.get("test_macro_f1")), ("test rows", m.get("test_rows")),
                ("in-scope accuracy with the reject rule", r.get("test_in_scope_accuracy")),
                ("out-of-scope recall", r.get("test_oos_recall")),
                ("out-of-scope precision", r.get("test_oos_precision")),
                ("reject rule", r.get("reject_note")),
                ("train samples/s", r.get("train_samples_per_s")), ("MLflow run", r.get("mlflow_run_id"))])]
    out.append(_figure(figs, "chart-train-loss", "Training loss and learning rate over steps"))
    out.append(_figure(figs, "chart-train-val", "Validation accuracy, macro-F1 and loss"))
    out.append(_figure(figs, "chart-confusion", "Confusion matrix on the test split", 700))
    out.append(f"<p>{link('train', 'history.jsonl', 'Per-step history')}; "
               f"{link('train', 'metrics.json', 'metrics')}</p>")
    return "".join(out)


def _register(v: StageView, link: _Links) -> str:
    r = v.row
    verdict = (f"registered as version {r['model_version']}" if r.get("registered") else "rejected")
    out = [f"<p>Registry gate: <b>{_e(verdict)}</b>: {_e(r.get('registration_reason'))}</p>"]
    behaviour = v.json("behaviour.json") or {}
    checks = behaviour.get("checks") or []
    rows = [[c["name"], c["rate"], c["threshold"], "pass" if c["passed"] else "FAIL", c.get("items")]
            for c in checks]
    # Checks that do not apply to this dataset say so, with the reason.
    rows += [[s["name"], "-", "-", s["note"], "-"] for s in behaviour.get("skipped") or []]
    if rows:
        out.append("<h3>Behavioural checks</h3>" + _table(
            rows, ["check", "rate", "threshold", "result", "items"], {1, 2, 4}))
    out.append(f"<p>{link('register', 'decision.json', 'Decision')}</p>")
    return "".join(out)


def _export(v: StageView, figs: dict[str, str], link: _Links) -> str:
    r = v.row
    if not r.get("exported"):
        return ""
    rep = v.json("report.json") or {}
    builds = rep.get("builds") or {}
    e = r["export"]
    out = [f"<p>Model version {_e(r.get('model_version'))}: int8 build <b>{_e((e.get('int8_status') or '').upper())}</b>"
           f" ({_e(e.get('int8_reason'))}).</p>"]
    rows = [[b, x.get("size_mb"), x.get("p50_ms_b1"), x.get("p99_ms_b1"), x.get("throughput_b32"), x.get("accuracy")]
            for b, x in builds.items()]
    out.append(_table(rows, ["build", "size MB", "p50 ms (batch 1)", "p99 ms (batch 1)",
                             "rows/s (batch 32)", "accuracy"], {1, 2, 3, 4, 5}))
    ra = rep.get("ratios") or e.get("ratios") or {}
    par = rep.get("parity") or {}
    out.append(_kv([("int8 speed-up against eager, batch 1", ra.get("int8_speedup_vs_eager_b1")),
                    ("int8 throughput against fp32, batch 32", ra.get("int8_throughput_vs_fp32_b32")),
                    ("int8 size share of fp32", ra.get("int8_size_share_of_fp32")),
                    ("int8 accuracy drop (points)", ra.get("int8_accuracy_drop_points")),
                    ("fp32 parity: max |logit difference|", par.get("max_abs_diff")),
                    ("int8 quantization", json.dumps((rep.get("int8") or {}).get("chosen"))),
                    ("test rows", rep.get("test_rows"))]))
    out.append(_figure(figs, "chart-export", "Size, latency, throughput and accuracy of the three builds"))
    out.append(f"<p>{link('export', 'report.md', 'Export report')}</p>")
    return "".join(out)


def _deploy(v: StageView, figs: dict[str, str], link: _Links) -> str:
    d = v.row.get("deploy") or {}
    roll = v.json("rollout.json") or {}
    out = [f"<p>Decision: <b class=\"{'ok' if d.get('decision') in ('promoted', 'already_serving') else 'failed'}\">"
           f"{_e(d.get('decision'))}</b>. Reason: {_e(d.get('reason'))}</p>"]
    acc, p99, err = roll.get("accuracy") or {}, roll.get("p99_ms") or {}, roll.get("error_rate") or {}
    out.append(_kv([("version", d.get("version")), ("stable version before", roll.get("stable_version")),
                    ("steps (% of traffic)", roll.get("steps")), ("steps passed", roll.get("steps_passed")),
                    ("probe requests", d.get("client_requests")), ("failed requests", d.get("client_failures")),
                    ("canary failures retried on stable", d.get("fallbacks")),
                    ("accuracy canary / stable", f"{_fmt(acc.get('canary'))} / {_fmt(acc.get('stable'))}" if acc else None),
                    ("p99 ms canary / stable", f"{_fmt(p99.get('canary'))} / {_fmt(p99.get('stable'))}" if p99 else None),
                    ("error rate canary / stable", f"{_fmt(err.get('canary'))} / {_fmt(err.get('stable'))}" if err else None),
                    ("seconds", d.get("seconds"))]))
    out.append(_figure(figs, "chart-canary", "Canary traffic weight and compared metrics over time"))
    events = roll.get("events") or []
    if events:
        out.append("<h3>Timeline</h3>" + _table([[round(ev["t"], 1), ev["event"]] for ev in events],
                                                ["seconds", "event"], {0}))
    out.append(f"<p>{link('deploy', 'rollout.json', 'Rollout record')}</p>")
    return "".join(out)


def render(rep: Report, mode: str = "airflow", figs: dict[str, str] | None = None) -> str:
    """The page. ``mode``: ``airflow`` (links to stage files through the plugin route) or
    ``mlflow`` (files named, not linked)."""
    figs = charts(rep) if figs is None else figs
    link = _Links(rep, mode)
    toc = "".join(f'<li><a href="#stage-{n}">{_e(TITLES[n])}</a> '
                  f'({_status_cell(v)})</li>' for n, v in rep.stages.items())
    sections = "".join(
        f'<section id="stage-{n}"><h2>{_e(TITLES[n])} <small>({_status_cell(v)})</small></h2>'
        f"{_section_body(rep, v, figs, link)}</section>"
        for n, v in rep.stages.items())
    config = _table([[k, v] for k, v in rep.config.items()], ["setting", "value"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>intentops run report: {_e(rep.dataset)} {_e(rep.run_id)}</title>
<style>{_CSS}</style></head>
<body>
<h1>intentops run report: {_e(rep.dataset)}</h1>
<p>Run <code>{_e(rep.run_id)}</code> of dataset <code>{_e(rep.dataset)}</code>: {_e(rep.verdict)}.
{f"Started by {_e(rep.started_by)}." if rep.started_by else ""}
Numbers and masked samples only: the page is built from the stages' outputs downstream of
desensitization and their counts.</p>
<nav id="contents"><h2>Contents</h2><ol>
<li><a href="#overview">Overview</a></li><li><a href="#cost">Cost</a></li>{toc}<li><a href="#config">Configuration</a></li></ol></nav>
<section id="overview"><h2>Overview</h2>{_overview(rep, figs)}</section>
<section id="cost"><h2>Cost</h2>{_cost(rep)}</section>
{sections}
<section id="config"><h2>Configuration</h2>{config}</section>
</body></html>
"""


# --------------------------------------------------------------------------- publishing


def _config(config_path_or_cfg: str | Path | PipelineConfig) -> PipelineConfig:
    if isinstance(config_path_or_cfg, PipelineConfig):
        return config_path_or_cfg
    return load_run_config(config_path_or_cfg)


def build_report(config_path_or_cfg: str | Path | PipelineConfig, run_id: str,
                 task_states: dict[str, str] | None = None) -> Path:
    """Write ``<lake>/runs/<run_id>/report.html`` (atomically) and return its path."""
    return publish(config_path_or_cfg, run_id, task_states, mlflow=False)[0]


def publish(config_path_or_cfg: str | Path | PipelineConfig, run_id: str,
            task_states: dict[str, str] | None = None, mlflow: bool = True) -> tuple[Path, str | None]:
    """Write the report into the run's folder and, with ``mlflow``, log its MLflow
    rendering to the registered version (see ``log_to_mlflow``). Returns the path and the
    artifact URI (None when nothing was logged)."""
    cfg = _config(config_path_or_cfg)
    rep = gather(cfg, run_id, task_states)
    figs = charts(rep)
    path = stage.run_dir(cfg.lake, run_id) / REPORT_FILE
    stage.atomic_write_text(path, render(rep, "airflow", figs))
    log.info("run report: %s (%s)", path, rep.verdict)
    return path, (_log(cfg, rep, figs) if mlflow else None)


def log_to_mlflow(config_path_or_cfg: str | Path | PipelineConfig, run_id: str,
                  task_states: dict[str, str] | None = None) -> str | None:
    """Log the report (the MLflow rendering) to the run of the model version this run
    registered, under ``report/<run_id>/report.html``, and tag the version with its URI
    (``intentops.report.artifact``). Returns the URI, or None (with a logged note) when
    the run registered no version."""
    cfg = _config(config_path_or_cfg)
    rep = gather(cfg, run_id, task_states)
    return _log(cfg, rep, charts(rep))


def publish_no_new_data(cfg: PipelineConfig, run_id: str) -> Path | None:
    """The report of an asset-triggered run that found no new data (``core.runs.NoNewData``):
    one page that says so, what started the run and what it would have read; None when the
    run's summary is not a no-new-data one."""
    folder = stage.run_dir(cfg.lake, run_id)
    summary = folder / "summary.json"
    if not summary.exists() or json.loads(summary.read_text()).get("status") != "no_new_data":
        return None
    lines = (folder / "summary.txt").read_text().splitlines()
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">
<title>intentops run report: {_e(cfg.dataset)} {_e(run_id)}</title><style>{_CSS}</style></head>
<body><h1>intentops run report: {_e(cfg.dataset)}</h1>
<p>Run <code>{_e(run_id)}</code>: <b class="failed">{_e(NO_NEW_DATA)}</b>: no stage ran and no model was trained.</p>
<ul>{"".join(f"<li>{_e(x)}</li>" for x in lines[2:])}</ul></body></html>
"""
    path = folder / REPORT_FILE
    stage.atomic_write_text(path, page)
    return path


COST_FILE = "cost.json"


def log_cost(cfg: PipelineConfig, rep: Report) -> str | None:
    """Log the run's cost to MLflow: ``cost_*`` metrics (``core.cost.mlflow_metrics``) and
    ``cost/<run_id>/cost.json``, on the training run when the run trained, else on its
    label-QA (data-quality) run. Returns the run id, or None when the run has neither."""
    from mlflow.entities import Metric

    from core import cost as pricing
    from core import tracking

    target = next((v.row.get("mlflow_run_id") for n in ("train", "labelqa")
                   if (v := rep.stages.get(n)) and v.row and v.row.get("mlflow_run_id")), None)
    if not target or not rep.cost.get("stages"):
        log.info("cost of run %s not logged to MLflow: it has no training or label-QA run", rep.run_id)
        return None
    client = tracking.mlflow_client(cfg)
    now = int(time.time() * 1000)
    client.log_batch(target, metrics=[Metric(k, float(v), now, 0)
                                      for k, v in pricing.mlflow_metrics(rep.cost).items()])
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / COST_FILE
        f.write_text(json.dumps({"run_id": rep.run_id, **rep.cost}, indent=2))
        client.log_artifact(target, str(f), artifact_path=f"cost/{stage.safe_run_id(rep.run_id)}")
    log.info("cost of run %s logged to MLflow run %s", rep.run_id, target)
    return target


def _log(cfg: PipelineConfig, rep: Report, figs: dict[str, str]) -> str | None:
    from core import tracking

    log_cost(cfg, rep)
    reg = rep.stages["register"].row
    if not reg or not reg.get("registered") or not reg.get("model_version"):
        why = ("it did not reach registration" if not reg
               else f"registration: {reg.get('registration_reason')}")
        log.info("run report not logged to MLflow: run %s registered no model version (%s)", rep.run_id, why)
        return None
    name, version = cfg.training.registered_model, str(reg["model_version"])
    client = tracking.mlflow_client(cfg)
    mv = client.get_model_version(name, version)
    art = f"report/{stage.safe_run_id(rep.run_id)}"
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / REPORT_FILE
        page.write_text(render(rep, "mlflow", figs))
        client.log_artifact(mv.run_id, str(page), artifact_path=art)
    uri = f"runs:/{mv.run_id}/{art}/{REPORT_FILE}"
    client.set_model_version_tag(name, version, ARTIFACT_TAG, uri)
    log.info("run report logged to %s v%s: %s", name, version, uri)
    return uri


def main(argv: list[str] | None = None) -> None:
    from core.config import load_config

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-id", required=True)
    p.add_argument("--resolved-config", help="the run's config.json (default: the one saved with the run)")
    p.add_argument("--mlflow", action="store_true", help="also log it to the registered version")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg_path = args.resolved_config or stage.run_dir(load_config().lake, args.run_id) / "config.json"
    try:
        path, uri = publish(cfg_path, args.run_id, mlflow=args.mlflow)
    except stage.StageError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(path)
    if args.mlflow:
        print(uri or "no model version registered by this run")


if __name__ == "__main__":
    main()
