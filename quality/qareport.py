"""The label-QA report: one self-contained HTML page (plots embedded as PNG data URIs, so
it opens from the lake, an MLflow artifact or a mail attachment alike)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import pandas as pd


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def annotator_confusion(ann: pd.DataFrame, consensus: pd.Series, top: int = 12) -> tuple[pd.DataFrame, list[str]]:
    """Annotation label (columns) against consensus label (rows), row-normalized, for the
    ``top`` classes annotators confuse most."""
    d = ann.assign(consensus=consensus.reindex(ann["item"]).to_numpy()).dropna(subset=["consensus"])
    wrong = d[d.label != d.consensus]
    worst = pd.concat([wrong.consensus, wrong.label]).value_counts().index[:top].tolist()
    sub = d[d.consensus.isin(worst) & d.label.isin(worst)]
    tab = pd.crosstab(sub.consensus, sub.label).reindex(index=worst, columns=worst, fill_value=0)
    return tab.div(tab.sum(1).replace(0, 1), axis=0), worst


def figures(items: pd.DataFrame, ann: pd.DataFrame, metrics: dict[str, Any]) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs: dict[str, str] = {}
    per_ann = pd.DataFrame(metrics["agreement"]["per_annotator"])
    if not per_ann.empty:
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(per_ann) + 1))
        per_ann = per_ann.sort_values("accuracy")
        # Pseudo-annotators (the label column, dedup copies) are marked: not in agreement.
        pseudo = per_ann.get("pseudo", pd.Series(False, index=per_ann.index)).fillna(False).astype(bool)
        names = [f"{n} (not an annotator)" if p else n for n, p in zip(per_ann.annotator, pseudo, strict=True)]
        ax.barh(names, per_ann.accuracy, color=["#999999" if p else "#4c72b0" for p in pseudo])
        ax.set_xlim(min(0.5, per_ann.accuracy.min() - 0.05), 1.0)
        ax.set_xlabel("accuracy against the consensus label")
        ax.set_title("Annotators")
        figs["annotator_accuracy"] = _png(fig)
    tab, worst = annotator_confusion(ann, items.consensus)
    if len(worst) >= 2:
        fig, ax = plt.subplots(figsize=(8, 7))
        im = ax.imshow(tab.to_numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks(range(len(worst)), worst, rotation=70, ha="right", fontsize=7)
        ax.set_yticks(range(len(worst)), worst, fontsize=7)
        ax.set_xlabel("annotator's label")
        ax.set_ylabel("consensus label")
        ax.set_title("Annotator confusion (most confused classes, row-normalized)")
        fig.colorbar(im, ax=ax, fraction=0.04)
        figs["annotator_confusion"] = _png(fig)
    per_class = pd.DataFrame(metrics["agreement"].get("per_class") or [])
    if not per_class.empty and per_class.krippendorff_alpha.notna().any():
        pc = per_class.dropna(subset=["krippendorff_alpha"]).sort_values("krippendorff_alpha")
        fig, ax = plt.subplots(figsize=(7, 0.16 * len(pc) + 1))
        ax.barh(pc.label, pc.krippendorff_alpha, color="#55a868")
        ax.tick_params(axis="y", labelsize=6)
        ax.set_xlabel("Krippendorff's alpha (class against the rest)")
        ax.set_title("Per-class agreement")
        figs["per_class_agreement"] = _png(fig)
    by_class = pd.Series(metrics["suspects_by_class"], dtype=float).sort_values()
    if len(by_class):
        fig, ax = plt.subplots(figsize=(7, 0.16 * len(by_class) + 1))
        ax.barh(by_class.index, by_class.to_numpy(), color="#c44e52")
        ax.tick_params(axis="y", labelsize=6)
        ax.set_xlabel("suspects (consensus class)")
        ax.set_title("Suspects by class")
        figs["suspects_by_class"] = _png(fig)
    return figs


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape('' if r.get(c) is None else str(r.get(c)))}</td>" for c in cols) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _feedback_section(f: dict[str, Any]) -> str:
    """Feedback labels of served predictions added to the train split (quality/feedback.py)."""
    if not f.get("feedback_rows"):
        return ("<h2>Feedback labels</h2><p>No feedback labels in the prediction log (the serving "
                "tier's <code>POST /v1/feedback</code>).</p>")
    by_class = ", ".join(f"{html.escape(k)} {v}" for k, v in (f.get("added_by_class") or {}).items()) or "none"
    return (f"<h2>Feedback labels</h2><p>{f['added']} of {f['feedback_rows']} labelled predictions added to "
            f"the train split (by class: {by_class}); left out: {f.get('overlaps_evaluation', 0)} equal to a "
            f"validation or test message, {f.get('duplicate_of_training', 0)} duplicates of training messages, "
            f"{f.get('outside_label_set', 0)} outside the label set, {f.get('no_text', 0)} logged without text, "
            f"{f.get('superseded', 0)} superseded by later feedback on the same text.</p>")


def _review_section(r: dict[str, Any]) -> str:
    """Review rounds (Label Studio): what reviewers did to the labels, round by round."""
    rows = [x | {"changed_by_class": ", ".join(f"{k}: {v}" for k, v in x["changed_by_class"].items())}
            for x in r.get("rounds") or []]
    if not rows and not r.get("reviewer_annotations"):
        return ("<h2>Review rounds</h2><p>No reviewed labels yet (the relabel queue goes to "
                "Label Studio with the <code>review</code> task; see README, the review loop).</p>")
    bad = r.get("outside_label_set", 0)
    return (f"<h2>Review rounds</h2><p>{r.get('items_reviewed', 0)} items reviewed, "
            f"{r.get('applied', 0)} reviewed labels applied over the consensus, "
            f"{r.get('unresolved_ties', 0)} left open (reviewers disagree); "
            f"{bad} reviewer labels outside the label set kept out"
            + (f" ({html.escape(', '.join(r.get('outside_label_set_examples') or []))})" if bad else "")
            + ". Reviewer labels are not in the agreement figures above. The model's test "
              "accuracy after a round is that of the first training on its labels (MLflow); "
              "before any review: "
            + html.escape(str(r.get("model_test_accuracy_before_reviews") or "no training recorded"))
            + "; the newest round's model is this run's own training (pending).</p>"
            + _table(rows, ["round", "items_reviewed", "resolved", "unresolved_ties",
                            "agreed_with_suggestion", "labels_changed", "changed_by_class",
                            "model_test_accuracy_after"]))


def render(items: pd.DataFrame, ann: pd.DataFrame, metrics: dict[str, Any], queue: pd.DataFrame,
           gate: dict[str, Any], run_id: str | None) -> str:
    figs = figures(items, ann, metrics)
    a = metrics["agreement"]
    skipped = "skipped" if a.get("note") else None
    overview = [
        {"figure": "items", "value": metrics["items"]},
        {"figure": "annotations", "value": metrics["annotations"]},
        {"figure": "items with two or more independent annotators", "value": a.get("agreement_items")},
        {"figure": "Krippendorff's alpha",
         "value": a.get("krippendorff_alpha") if a.get("krippendorff_alpha") is not None else "skipped"},
        {"figure": "Fleiss' kappa", "value": a.get("fleiss_kappa") if a.get("fleiss_kappa") is not None else skipped},
        {"figure": "mean per-item agreement",
         "value": a.get("mean_item_agreement") if a.get("mean_item_agreement") is not None else skipped},
        {"figure": "suspects (relabel queue)", "value": metrics["suspects"]},
        {"figure": "suspect rate", "value": metrics["suspect_rate"]},
        {"figure": "cleanlab issues", "value": metrics["cleanlab_issues"]},
        {"figure": "consensus changed the exported label", "value": metrics["consensus_changed_exported_label"]},
        {"figure": "dedup clusters with disagreeing labels", "value": metrics["dedup_label_conflict_items"]},
        {"figure": "dedup conflict rate", "value": metrics.get("conflict_rate")},
        {"figure": "curated rows", "value": metrics["curated_rows"]},
        {"figure": "curated split", "value": metrics["curated_by_split"]},
        {"figure": "classes too small for cross-validation", "value": ", ".join(metrics["classes_too_small_for_cv"]) or "none"},
    ]
    note = metrics.get("agreement_note") or a.get("note")
    notes = [f"Agreement {note}" if note.startswith("skipped") else note] if note else []
    conflicts = metrics.get("conflict_rate_by_class") or []
    gate_rows = [{"check": c["name"], "value": c["value"], "threshold": c["threshold"],
                  "result": "pass" if c["passed"] else ("skipped" if c["passed"] is None else "FAIL"),
                  "note": c.get("note")} for c in gate["checks"]]
    pairs = sorted(a.get("cohen_kappa") or [], key=lambda r: r["kappa"] if r["kappa"] is not None else 2)[:15]
    top = queue.head(25).to_dict("records")
    img = "".join(
        f'<figure><img alt="{html.escape(k)}" src="{v}"><figcaption>{html.escape(k.replace("_", " "))}</figcaption></figure>'
        for k, v in figs.items()
    )
    verdict = "PASSED" if gate["passed"] else "FAILED"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Label QA {html.escape(run_id or "")}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1100px; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }}
.pass {{ color: #2a7a2a; }} .fail {{ color: #b22; }}
figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>Label QA <span class="{"pass" if gate["passed"] else "fail"}">{verdict}</span></h1>
<p>Run <code>{html.escape(run_id or "-")}</code>. Consensus by {html.escape(metrics["consensus_method"])};
suspects by confident learning (cleanlab) on out-of-fold TF-IDF + logistic regression
probabilities combined with the annotators' evidence. Texts are the desensitized ones.</p>
{"".join(f"<p><b>Note:</b> {html.escape(n)}</p>" for n in notes)}
<h2>Gate</h2>{_table(gate_rows, ["check", "value", "threshold", "result", "note"])}
<h2>Overview</h2>{_table(overview, ["figure", "value"])}
<h2>Dedup label conflicts</h2>
<p>{metrics.get("dedup_label_conflict_items", 0)} of {metrics["items"]} items (rate {metrics.get("conflict_rate")})
stand for a dedup cluster whose copies carry different labels; the copies' other label is one
more vote in the consensus (<code>_dedup_copy</code>), never an annotator in the agreement figures.
Classes by conflict rate (an item counts toward every label its cluster carries):</p>
{_table(conflicts, ["label", "items", "conflicts", "rate"]) if conflicts else "<p>No conflicts.</p>"}
<h2>Plots</h2>{img}
<h2>Annotators</h2>{_table(a.get("per_annotator") or [], ["annotator", "annotations", "accuracy", "pseudo"])}
<h3>Least agreeing annotator pairs (Cohen's kappa)</h3>{_table(pairs, ["a", "b", "items", "kappa", "observed"])}
{_review_section(metrics.get("review") or {})}
{_feedback_section(metrics.get("feedback") or {})}
<h2>Relabel queue (top 25 of {len(queue)})</h2>
{_table(top, ["rank", "record_id", "text", "given_label", "annotations", "suggested_label", "score", "reason"])}
<p>The whole queue: <a href="relabel_queue.csv">relabel_queue.csv</a>,
<a href="relabel_queue.json">relabel_queue.json</a> (Label Studio tasks; labeling config in
<a href="label_studio_config.xml">label_studio_config.xml</a>).</p>
</body></html>
"""
