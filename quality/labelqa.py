"""Label QA: consensus labels, label-issue detection, curated split and relabel queue.

The method, in order:

1. **Annotations.** Each item's annotations (``annotations`` column; the export's label
   column counts as the one annotation of an item that has none) are canonicalized like
   the label column; a label outside the label set is dropped and counted.
2. **Consensus** per item by Dawid-Skene (crowd-kit's EM, initialized by majority vote):
   annotators differ in reliability, and Dawid-Skene weighs each by its estimated
   confusion matrix instead of counting votes equally. ``consensus: majority`` is plain
   majority vote; ties go to the label of the annotator with the best accuracy against
   the first majority pass, then to the alphabetically first label. An item with no valid
   annotation has no consensus and goes to the relabel queue.
3. **Out-of-sample probabilities** from TF-IDF (word 1-2-grams and character 2-5-grams)
   with logistic regression, ``cv_folds``-fold stratified cross-validation against the
   consensus labels. A class with fewer items than folds is reported and left out of the
   model (its items get no model check), not a crash.
4. **Confident learning** with cleanlab (``find_label_issues``, prune by noise rate) on
   those probabilities against the consensus labels.
5. **Label quality**: a posterior per item with the model's probabilities as the prior
   and the annotators' likelihood (each annotator right with its accuracy against the
   consensus, wrong uniformly otherwise), so a message that reliable annotators agree on
   is not flagged because the classifier hesitates, while a single annotation the model
   confidently rejects is. The label quality is the posterior of the consensus label.
6. **Suspects**: no valid label, or label quality below ``min_label_quality``, or
   cleanlab flags an item with a single annotation (with several, the posterior weighs
   cleanlab's model against the annotators; its flags are kept in ``cleanlab_issue``).
   The score is ``1 - label quality`` (the probability that the consensus label is
   wrong); the suggested label is the posterior's argmax.
7. **Dedup conflicts**: a survivor whose dedup cluster merged copies with other labels
   gets the copies' other label as one more annotation (annotator ``_dedup_copy``,
   weighed by Dawid-Skene like any annotator) and is marked in the queue. The share of
   such items (``conflict_rate``, overall and per class) is a signal of its own, gated by
   ``max_conflict_rate``.
8. **Agreement** (Krippendorff's alpha, Fleiss' and Cohen's kappa, item agreement) counts
   independent annotators only: the label column (``_export``) and dedup copies
   (``_dedup_copy``) inform the consensus but are not annotators. It is computed over the
   items with two or more independent annotations, when there are at least
   ``min_agreement_items`` of them; otherwise it is skipped with a note (``agreement_note``)
   and so is the gate's alpha check. A single-label export has no agreement to measure;
   confident learning still checks its labels.

Outputs (published as one stage): ``curated/`` (consensus labels, suspects handled by
``suspects`` = exclude | relabel | downweight, a grouped stratified train/val/test
split), ``relabel_queue.csv`` and ``relabel_queue.json`` (Label Studio tasks with the
suggested label as a prediction, plus ``label_studio_config.xml``), ``metrics.json`` and
``qa_report.html``.

Reviewed labels (the lake's ``reviewer`` source, from Label Studio: ``quality/review.py``)
are applied by the stage after this analysis: a reviewed label wins over the consensus and
never enters the agreement figures.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

import textnorm
from core.config import LabelQAConfig
from core.stage import StageVerdict
from quality import agreement

log = logging.getLogger(__name__)

EXPORT_ANNOTATOR = "_export"  # the label column, when an item has no annotations
DEDUP_ANNOTATOR = "_dedup_copy"  # a dedup copy's other label (see _dedup_votes)
# Sources that vote in the consensus but are not annotators: never in agreement figures.
PSEUDO_ANNOTATORS = (EXPORT_ANNOTATOR, DEDUP_ANNOTATOR)


# --------------------------------------------------------------------------- annotations


def annotations_long(items: pd.DataFrame, classes: list[str]) -> tuple[pd.DataFrame, dict[str, int]]:
    """One row per (item, annotator, label) with a valid label; counts of what was dropped."""
    valid = set(classes)
    rows: list[tuple[int, str, str]] = []
    dropped = 0
    from_export = 0
    for i, (anns, given) in enumerate(zip(items.annotations, items.given, strict=True)):
        got = False
        if anns is not None and len(anns):
            for a in anns:
                lab = textnorm.normalize_label(a.get("label")) if a is not None else None
                who = (a or {}).get("annotator") or "_unknown"
                if lab in valid:
                    rows.append((i, who, lab))
                    got = True
                else:
                    dropped += 1
        if not got and given in valid:
            rows.append((i, EXPORT_ANNOTATOR, given))
            from_export += 1
    ann = pd.DataFrame(rows, columns=["item", "annotator", "label"])
    ann = ann.drop_duplicates(["item", "annotator"], keep="first")
    return ann, {"invalid_annotations_dropped": dropped, "items_labeled_from_export_only": from_export}


def _dedup_votes(items: pd.DataFrame, ann: pd.DataFrame, classes: list[str]) -> tuple[pd.DataFrame, int]:
    """Dedup merged copies of a message whose labels disagree (``label_conflict``): the
    copies' other label becomes one more annotation of the survivor, by the pseudo
    annotator ``_dedup_copy`` whose reliability Dawid-Skene estimates like anyone's. On
    the 10%-noise benchmark build this raised consensus accuracy on the 2,112 conflict
    clusters from 0.921 to 0.947 (docs/BENCHMARKS.md)."""
    if "cluster_labels" not in items:
        return ann, 0
    valid = set(classes)
    rows = []
    for i, (conflict, labels, given) in enumerate(zip(items.label_conflict, items.cluster_labels,
                                                     items.given, strict=True)):
        if not conflict or labels is None:
            continue
        others = sorted({textnorm.normalize_label(x) for x in labels} - {given, None})
        others = [x for x in others if x in valid]
        if others:
            rows.append((i, DEDUP_ANNOTATOR, others[0]))
    if not rows:
        return ann, 0
    extra = pd.DataFrame(rows, columns=["item", "annotator", "label"])
    return pd.concat([ann, extra], ignore_index=True), len(rows)


def majority(ann: pd.DataFrame, n_items: int, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Majority vote: label index per item (-1 without annotations) and posterior-like
    vote shares. Ties go to the label of the annotator with the best accuracy against an
    untied first pass, then to the alphabetically first label."""
    counts = agreement.count_matrix(ann, n_items, classes).astype(np.float64)
    has = counts.sum(1) > 0
    first = counts.argmax(1)  # argmax breaks ties by the first (alphabetical) label
    c_arr = np.asarray(classes, dtype=object)
    acc = (ann.label == c_arr[first[ann["item"].to_numpy()]]).groupby(ann.annotator).mean()
    # A bonus far below one vote, proportional to the annotator's accuracy: breaks ties only.
    bonus = np.zeros_like(counts)
    np.add.at(bonus, (ann["item"].to_numpy(), pd.Categorical(ann.label, categories=classes).codes),
              ann.annotator.map(acc).fillna(0).to_numpy() * 1e-3)
    lab = np.where(has, (counts + bonus).argmax(1), -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = counts / counts.sum(1, keepdims=True)
    return lab, share


def dawid_skene(ann: pd.DataFrame, n_items: int, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Dawid-Skene EM (crowd-kit): label index per item (-1 without annotations) and the
    posterior (items x classes, NaN rows for items without annotations)."""
    from crowdkit.aggregation import DawidSkene

    post = np.full((n_items, len(classes)), np.nan)
    lab = np.full(n_items, -1)
    if ann.empty:
        return lab, post
    df = ann.rename(columns={"item": "task", "annotator": "worker"})
    ds = DawidSkene(n_iter=50, tol=1e-4).fit(df)
    proba = ds.probas_.reindex(columns=classes, fill_value=0.0)
    idx = proba.index.to_numpy(dtype=np.int64)
    post[idx] = proba.to_numpy()
    lab[idx] = post[idx].argmax(1)
    return lab, post


def annotation_loglik(ann: pd.DataFrame, n_items: int, classes: list[str],
                      consensus: np.ndarray) -> np.ndarray:
    """items x classes: log P(item's annotations | true class), each annotator's confusion
    estimated against the consensus (add-one smoothed toward 'right with its accuracy,
    wrong uniformly'); zero for an item without annotations."""
    k = len(classes)
    code = pd.Categorical(ann.label, categories=classes).codes
    item = ann["item"].to_numpy()
    ok = consensus[item] >= 0
    acc = (
        pd.DataFrame({"a": ann.annotator.to_numpy()[ok], "ok": (code[ok] == consensus[item[ok]])})
        .groupby("a").ok.agg(["sum", "size"])
    )
    # One-coin per annotator (accuracy with a Beta(2,1) prior): with 77 classes a full
    # confusion matrix per annotator is too sparse to use as a likelihood.
    p_right = ((acc["sum"] + 2) / (acc["size"] + 3)).reindex(ann.annotator.unique()).fillna(2 / 3)
    pr = ann.annotator.map(p_right).to_numpy()
    ll = np.zeros((n_items, k))
    wrong = np.log((1 - pr) / (k - 1))
    np.add.at(ll, item, wrong[:, None] * np.ones((1, k)))
    np.add.at(ll, (item, code), np.log(pr) - wrong)
    return ll


# --------------------------------------------------------------------------- model


def oof_probabilities(texts: pd.Series, labels: np.ndarray, n_classes: int, cfg: LabelQAConfig,
                      ) -> tuple[np.ndarray, list[int]]:
    """Out-of-fold predicted probabilities (items x classes; NaN rows for items left out).
    Classes with fewer than ``cv_folds`` items are left out and returned.

    TF-IDF word 1-2-grams with multinomial logistic regression (saga, a few epochs): on
    100,000 messages it reaches the accuracy of a fully converged lbfgs fit at a fifth of
    the time (measured in docs/BENCHMARKS.md); character n-grams tripled the time for no
    gain in detection."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    probs = np.full((len(texts), n_classes), np.nan)
    sizes = np.bincount(labels[labels >= 0], minlength=n_classes)
    small = [int(c) for c in np.flatnonzero((sizes > 0) & (sizes < cfg.cv_folds))]
    use = (labels >= 0) & ~np.isin(labels, small)
    if use.sum() < cfg.cv_folds or len(np.unique(labels[use])) < 2:
        return probs, small
    idx = np.flatnonzero(use)
    y = labels[idx]
    t = texts.iloc[idx].fillna("").to_numpy()
    skf = StratifiedKFold(n_splits=cfg.cv_folds, shuffle=True, random_state=cfg.seed)
    for tr, te in skf.split(t, y):
        # The vectorizer is fit on the training fold only: the held-out fold stays unseen.
        vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True,
                              max_features=cfg.max_features)
        xtr = vec.fit_transform(t[tr])
        clf = LogisticRegression(C=10.0, solver="saga", max_iter=cfg.max_iter, tol=1e-3,
                                 random_state=cfg.seed)
        with warnings.catch_warnings():
            # A few saga epochs are the point (see above), not a failure to converge.
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(xtr, y[tr])
        p = np.zeros((len(te), n_classes))
        p[:, clf.classes_] = clf.predict_proba(vec.transform(t[te]))
        probs[idx[te]] = p
    return probs, small


# --------------------------------------------------------------------------- detection


@dataclass
class Analysis:
    items: pd.DataFrame  # one row per item with every per-item result
    ann: pd.DataFrame
    agreement: dict[str, Any]
    info: dict[str, Any]


def _posterior(log_prior: np.ndarray, loglik: np.ndarray) -> np.ndarray:
    lp = log_prior + loglik
    lp -= lp.max(1, keepdims=True)
    p = np.exp(lp)
    return p / p.sum(1, keepdims=True)


def cleanlab_issues(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """cleanlab's confident-learning filter on the rows that have a label and model
    probabilities; classes absent from those labels are dropped and the rows renormalized
    (cleanlab requires every probability column to be a class it sees)."""
    from cleanlab.filter import find_label_issues

    out = np.zeros(len(labels), dtype=bool)
    rows = np.flatnonzero((labels >= 0) & ~np.isnan(probs).any(1))
    if len(rows) < 2:
        return out
    present = np.unique(labels[rows])
    if len(present) < 2:
        return out
    remap = np.full(probs.shape[1], -1)
    remap[present] = np.arange(len(present))
    p = probs[np.ix_(rows, present)]
    p = np.clip(p, 1e-12, None)
    p /= p.sum(1, keepdims=True)
    # n_jobs=1: cleanlab's multiprocessing pool can deadlock on exit inside a threaded host
    # (it hung an Airflow task); one process is fast enough at this size.
    out[rows] = find_label_issues(remap[labels[rows]], p, filter_by="prune_by_noise_rate", n_jobs=1)
    return out


def analyze(items: pd.DataFrame, classes: list[str], cfg: LabelQAConfig) -> Analysis:
    """``items``: record_id, text, label, annotations (list of {annotator, label}) and,
    from dedup, cluster_labels / label_conflict. Returns the per-item results."""
    items = items.reset_index(drop=True).copy()
    # Inputs without dedup's columns (a plain export) have no label conflicts.
    conflict = items["label_conflict"] if "label_conflict" in items else pd.Series(False, index=items.index)
    items["label_conflict"] = conflict.fillna(False).astype(bool)
    valid = set(classes)
    items["given"] = [x if x in valid else None for x in items.label.map(textnorm.normalize_label)]
    ann, info = annotations_long(items, classes)
    ann, info["dedup_conflict_votes"] = _dedup_votes(items, ann, classes)
    n, k = len(items), len(classes)
    if cfg.consensus == "majority":
        cons, _ = majority(ann, n, classes)
    else:
        cons, _ = dawid_skene(ann, n, classes)
    # Pseudo-annotators (the label column, dedup copies) vote in the consensus above but
    # are not independent annotators: agreement is over real annotators only.
    agr = agreement.agreement(ann, n, classes, pd.Series(np.where(
        cons >= 0, np.asarray(classes, dtype=object)[np.maximum(cons, 0)], None)),
        pseudo=PSEUDO_ANNOTATORS, min_items=cfg.min_agreement_items,
        min_items_setting="labelqa.min_agreement_items")
    probs, small = oof_probabilities(items.text, cons, k, cfg)
    cl = cleanlab_issues(cons, probs)
    loglik = annotation_loglik(ann, n, classes, cons)
    has_model = ~np.isnan(probs).any(1)
    prior = np.where(has_model[:, None], np.log(np.clip(np.nan_to_num(probs), 1e-6, 1.0)), 0.0)
    post = _posterior(prior, loglik)
    has_ann = cons >= 0
    quality = np.where(has_ann, post[np.arange(n), np.maximum(cons, 0)], np.nan)
    suggested = np.where(has_ann | has_model, post.argmax(1), -1)
    low = has_ann & (quality < cfg.min_label_quality)
    n_ann = np.bincount(ann["item"], minlength=n) if len(ann) else np.zeros(n, dtype=np.int64)
    # cleanlab alone decides only where there is a single annotation to weigh: with
    # several, its flags on items the annotators agree on were ~99% false positives on a
    # 5,000-item build (a classifier with 65 examples per class hesitates a lot), while
    # the posterior already folds the model in (docs/BENCHMARKS.md, label QA).
    cl_alone = cl & (n_ann <= 1)
    reasons = np.full(n, None, dtype=object)
    reasons[cl_alone] = "confident learning (cleanlab) flags the only annotation"
    reasons[low] = "low label quality (annotators and model disagree with the consensus)"
    reasons[low & cl] = "low label quality; confident learning (cleanlab) flags it too"
    reasons[~has_ann] = "no valid label"
    suspect = ~has_ann | low | cl_alone
    c_arr = np.asarray(classes + [None], dtype=object)  # index -1 -> None
    items["consensus"] = c_arr[cons]
    items["suggested"] = c_arr[suggested]
    items["label_quality"] = quality
    items["model_label"] = np.where(has_model, c_arr[np.nan_to_num(probs, nan=0).argmax(1)], None)
    items["cleanlab_issue"] = cl
    items["suspect"] = suspect
    # Score for ranking the queue: the probability that the consensus label is wrong.
    items["score"] = np.where(has_ann, 1.0 - np.nan_to_num(quality), 1.0)
    items["reason"] = reasons
    items["n_annotations"] = n_ann
    # Share of the item's independent annotation pairs that agree (NaN with fewer than two
    # independent annotations: the label column and dedup copies do not count).
    items["item_agreement"] = agreement.item_agreement(
        agreement.count_matrix(agreement.independent(ann, PSEUDO_ANNOTATORS), n, classes))
    info |= {
        "classes_too_small_for_cv": [classes[c] for c in small],
        "items_without_model_check": int((~has_model).sum()),
        "items_without_valid_label": int((~has_ann).sum()),
    }
    return Analysis(items, ann, agr, info)


# --------------------------------------------------------------------------- outputs


def split_groups(labels: pd.Series, groups: pd.Series, fractions: tuple[float, float, float],
                 seed: int) -> np.ndarray:
    """'train' / 'val' / 'test' per row, stratified by label, whole groups at a time.

    Hand-written because scikit-learn's StratifiedGroupKFold gives k equal folds, not
    80/10/10, and loops in Python over every group (slow at 100,000 groups). Each group
    takes its most common label; within a label, groups are shuffled and filled into test,
    then val, then train until each holds its share of the label's rows."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"label": labels.to_numpy(), "group": groups.to_numpy()})
    g = df.groupby("group").agg(label=("label", lambda s: s.mode().iloc[0]), size=("label", "size"))
    out = pd.Series("train", index=g.index, dtype=object)
    _, f_val, f_test = fractions
    for _, sub in g.groupby("label"):
        order = sub.index.to_numpy()[rng.permutation(len(sub))]
        csum = np.cumsum(sub["size"].loc[order].to_numpy())
        total = csum[-1]
        # A group goes to test while the rows before it are under the test share, etc.
        before = csum - sub["size"].loc[order].to_numpy()
        n_test, n_val = round(total * f_test), round(total * f_val)
        part = np.where(before < n_test, "test", np.where(before < n_test + n_val, "val", "train"))
        out.loc[order] = part
    return out.loc[df.group].to_numpy()


def curated(a: Analysis, cfg: LabelQAConfig) -> pd.DataFrame:
    """The training set: consensus labels; suspects excluded, relabeled with the
    suggestion, or down-weighted (``suspects``); items without any label always left out."""
    d = a.items
    keep = d.consensus.notna()
    label = d.consensus.copy()
    weight = pd.Series(1.0, index=d.index)
    if cfg.suspects == "exclude":
        keep &= ~d.suspect
    elif cfg.suspects == "relabel":
        label = label.where(~d.suspect | d.suggested.isna(), d.suggested)
    elif cfg.suspects == "downweight":
        weight = weight.where(~d.suspect, cfg.downweight)
    else:
        raise ValueError(f"labelqa.suspects must be exclude, relabel or downweight, not {cfg.suspects!r}")
    out = pd.DataFrame({
        "record_id": d.record_id, "text": d.text, "label": label, "weight": weight,
        "consensus_label": d.consensus, "given_label": d.given, "suspect": d.suspect,
        "label_quality": d.label_quality,
        "item_agreement": d.item_agreement,
        "n_annotations": d.n_annotations,
        "cluster_id": d.get("cluster_id", d.record_id),
        # "reviewer" where a reviewed label (Label Studio) won over the consensus.
        "label_source": d.get("label_source", pd.Series("consensus", index=d.index)),
    })[keep].reset_index(drop=True)
    out["split"] = split_groups(out.label, out.cluster_id, cfg.split, cfg.seed)
    return out


def _annotation_text(anns: Any) -> str:
    if anns is None or not len(anns):
        return ""
    return "; ".join(f"{a.get('annotator')}: {a.get('label')}" for a in anns if a is not None)


def relabel_queue(a: Analysis) -> pd.DataFrame:
    d = a.items[a.items.suspect].sort_values(["score", "record_id"], ascending=[False, True])
    return pd.DataFrame({
        "rank": np.arange(1, len(d) + 1),
        "record_id": d.record_id.to_numpy(),
        "text": d.text.to_numpy(),
        "given_label": d.given.to_numpy(),
        "annotations": [_annotation_text(x) for x in d.annotations],
        "consensus_label": d.consensus.to_numpy(),
        "item_agreement": d.item_agreement.round(4).to_numpy(),
        "suggested_label": d.suggested.to_numpy(),
        "score": d.score.round(6).to_numpy(),
        "reason": d.reason.to_numpy(),
        "dedup_label_conflict": d.label_conflict.to_numpy(),
    })


LS_FROM, LS_TO = "intent", "text"


def label_studio_config(classes: list[str]) -> str:
    from xml.sax.saxutils import quoteattr

    choices = "\n".join(f"    <Choice value={quoteattr(c)}/>" for c in classes)
    return (
        "<View>\n"
        f'  <Text name="{LS_TO}" value="$text"/>\n'
        f'  <Choices name="{LS_FROM}" toName="{LS_TO}" choice="single" showInline="false">\n'
        f"{choices}\n  </Choices>\n</View>\n"
    )


def label_studio_tasks(queue: pd.DataFrame) -> list[dict[str, Any]]:
    """Label Studio's task import format: ``data`` for the labeling view, the suggested
    label as a pre-annotation in ``predictions`` (reviewers accept or change it)."""
    tasks = []
    for r in queue.itertuples(index=False):
        task: dict[str, Any] = {
            "data": {
                "text": r.text, "record_id": r.record_id, "rank": int(r.rank),
                "given_label": r.given_label, "annotations": r.annotations,
                "consensus_label": r.consensus_label, "reason": r.reason,
                "score": float(r.score),
            }
        }
        if r.suggested_label:
            task["predictions"] = [{
                # who suggested: label QA's classifier, or the champion (review push)
                "model_version": getattr(r, "suggested_by", "") or "intentops-labelqa",
                "score": float(r.score),
                "result": [{
                    "from_name": LS_FROM, "to_name": LS_TO, "type": "choices",
                    "value": {"choices": [r.suggested_label]},
                }],
            }]
        tasks.append(task)
    return tasks


def _cluster_label_sets(items: pd.DataFrame) -> list[set[str]]:
    """Per item, the labels its dedup cluster carries: its own valid label and, where dedup
    recorded them, its copies' (normalized)."""
    own = items.given if "given" in items else items.label.map(textnorm.normalize_label)
    if "cluster_labels" not in items:
        return [{g} - {None} for g in own]
    out = []
    for g, labels in zip(own, items.cluster_labels, strict=True):
        labs = {g} if labels is None else {g} | {textnorm.normalize_label(x) for x in labels}
        out.append(labs - {None})
    return out


def conflict_rates(items: pd.DataFrame, top: int = 15) -> dict[str, Any]:
    """Dedup label conflicts as a signal: the share of items whose dedup cluster merged
    copies with disagreeing labels (``label_conflict``), overall and per class.

    An item counts toward every class its cluster carries (its own label and its copies'),
    so a class's rate does not depend on which copy dedup kept: of the items where the
    class occurs, the share whose copies disagree. ``conflict_rate_by_class`` holds the
    ``top`` classes by rate (then by count) among those with a conflict."""
    n = len(items)
    conflict = items.label_conflict.fillna(False).astype(bool).to_numpy() if n else np.zeros(0, bool)
    rows = [(lab, bool(c)) for labs, c in zip(_cluster_label_sets(items), conflict, strict=True)
            for lab in labs]
    per = pd.DataFrame(rows, columns=["label", "conflict"])
    by_class: list[dict[str, Any]] = []
    if len(per):
        g = per.groupby("label").conflict.agg(items="size", conflicts="sum").reset_index()
        g = g[g.conflicts > 0].assign(rate=lambda t: t.conflicts / t["items"])
        g = g.sort_values(["rate", "conflicts", "label"], ascending=[False, False, True]).head(top)
        by_class = [{"label": str(r.label), "items": int(r.items), "conflicts": int(r.conflicts),
                     "rate": round(float(r.rate), 6)} for r in g.itertuples(index=False)]
    return {
        "conflict_items": int(conflict.sum()),
        "conflict_rate": round(float(conflict.mean()), 6) if n else 0.0,
        "conflict_rate_by_class": by_class,
    }


def agreement_note(ag: dict[str, Any]) -> str | None:
    """Why there is no Krippendorff's alpha (None when there is one): agreement skipped
    (too few items with independent annotators) or alpha undefined (one class seen)."""
    if ag.get("krippendorff_alpha") is not None:
        return None
    return ag.get("note") or (
        "skipped: Krippendorff's alpha is undefined (the independent annotations name a single class)")


def metrics(a: Analysis, cur: pd.DataFrame, queue: pd.DataFrame) -> dict[str, Any]:
    d = a.items
    n = len(d)
    conflicts = conflict_rates(d)
    by_class = d[d.suspect].consensus.fillna("<none>").value_counts()
    return {
        "items": n,
        "annotations": int(len(a.ann)),
        "suspects": int(d.suspect.sum()),
        "suspect_rate": round(float(d.suspect.mean()), 6) if n else 0.0,
        "cleanlab_issues": int(d.cleanlab_issue.sum()),
        "exported_label_disagrees_with_suggestion": int((d.given.notna() & (d.given != d.suggested)).sum()),
        "consensus_changed_exported_label": int((d.given.notna() & (d.given != d.consensus)).sum()),
        "model_agrees_with_consensus": round(float((d.model_label == d.consensus)[d.model_label.notna()].mean()), 6)
        if d.model_label.notna().any() else None,
        "dedup_label_conflict_items": conflicts["conflict_items"],
        "dedup_label_conflict_suspects": int((d.label_conflict & d.suspect).sum()),
        "conflict_rate": conflicts["conflict_rate"],
        "conflict_rate_by_class": conflicts["conflict_rate_by_class"],
        "suspects_by_class": {str(k): int(v) for k, v in by_class.items()},
        "curated_rows": int(len(cur)),
        "curated_by_split": {str(k): int(v) for k, v in cur.split.value_counts().sort_index().items()},
        "queue_rows": int(len(queue)),
        **a.info,
        "agreement_note": agreement_note(a.agreement),
        "agreement": a.agreement,
    }


# --------------------------------------------------------------------------- gate


class QAGateFailed(StageVerdict):
    """Label quality is below the configured bar (a property of the data, not transient)."""


def gate_checks(m: dict[str, Any], cfg: LabelQAConfig) -> dict[str, Any]:
    alpha = m["agreement"].get("krippendorff_alpha")
    checks = [
        {
            "name": "krippendorff_alpha >= min_alpha",
            "value": alpha,
            "threshold": cfg.min_alpha,
            # No alpha (agreement skipped, or undefined): the check is skipped with the reason.
            "passed": None if alpha is None else bool(alpha >= cfg.min_alpha),
            "note": agreement_note(m["agreement"]),
        },
        {
            "name": "suspect_rate <= max_suspect_rate",
            "value": m["suspect_rate"],
            "threshold": cfg.max_suspect_rate,
            "passed": bool(m["suspect_rate"] <= cfg.max_suspect_rate),
            "note": None,
        },
        {
            "name": "conflict_rate <= max_conflict_rate",
            "value": m["conflict_rate"],
            "threshold": cfg.max_conflict_rate,
            "passed": bool(m["conflict_rate"] <= cfg.max_conflict_rate),
            "note": None,
        },
        {
            "name": "curated set is not empty",
            "value": m["curated_rows"],
            "threshold": 1,
            "passed": bool(m["curated_rows"] >= 1),
            "note": None,
        },
    ]
    return {"passed": all(c["passed"] is not False for c in checks), "checks": checks}


def describe_failure(gate: dict[str, Any], out: str) -> str:
    bad = [c for c in gate["checks"] if c["passed"] is False]
    parts = [f"{c['name']}: {c['value']} (threshold {c['threshold']})" for c in bad]
    return ("label QA gate failed: " + "; ".join(parts)
            + f". The QA report and the relabel queue are in {out}")
