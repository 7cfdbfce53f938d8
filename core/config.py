"""The pipeline's one typed configuration.

Resolved once per run from, in increasing priority:

1. the defaults below,
2. a YAML file (``configs/pipeline.yaml`` by default, or ``INTENTOPS_CONFIG``),
3. environment variables ``INTENTOPS__<SECTION>__<FIELD>`` (e.g. ``INTENTOPS__DEDUP__THRESHOLD=0.85``),
4. explicit overrides (DAG params, ``--set section.field=value`` on the command line).

The resolved config is saved with every stage output (in its manifest), so any output
says exactly which settings produced it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG_FILE = PROJECT_ROOT / "configs" / "pipeline.yaml"
ENV_PREFIX = "INTENTOPS__"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ColumnMap(_Section):
    """Where each field the pipeline needs lives in the user's export."""

    id: str | None = "ticket_id"  # a stable id makes quarantine and lineage traceable
    text: str = "message"
    label: str = "intent"
    annotations: str | None = "annotations"  # JSON list of {"annotator", "label"}
    created_at: str | None = "created_at"  # orders duplicates: the earliest one survives
    channel: str | None = "channel"


class InputConfig(_Section):
    path: str = Field(
        "var/demo/raw/daily",
        description="Raw export to process: a CSV, JSONL or Parquet file or folder. A folder of "
        "date partitions (date=YYYY-MM-DD/): scheduled and backfill runs read the days of their "
        "data interval, manual runs all of it. Relative paths are relative to the project")
    format: Literal["auto", "csv", "jsonl", "parquet"] = Field(
        "auto", description="Format of the export; auto picks by file extension")
    columns: ColumnMap = Field(default_factory=ColumnMap)
    # Line-by-line CSV parsing keeps a broken quote from swallowing the following rows
    # (every physical line stays one record, so every row can be accounted for). Turn on
    # only for exports that put raw newlines inside quoted fields.
    csv_multiline: bool = False
    encoding: str = "UTF-8"
    # When ``path`` is a folder of Hive-style date partitions (``date=YYYY-MM-DD/``), the
    # partitions to read, relative to it; empty reads the whole input. The DAG fills it
    # from a scheduled or backfill run's data interval (core/partitions.py), so each
    # run owns its days and a rerun of the same days is a cache hit.
    partitions: list[str] = Field(default_factory=list)


class CleanConfig(_Section):
    # The label set: "file" reads ``labels_file`` (a JSON list of label names); "infer"
    # takes every label that occurs at least ``min_class_count`` times in the export, and
    # quarantines the rows of rarer labels (reason ``rare_label``). Either way the set is
    # published with the clean output (``labels.json``) and every later stage reads it there.
    label_set: Literal["file", "infer"] = "file"
    labels_file: str = "data/banking77/categories.json"
    min_class_count: int = Field(10, ge=1)
    min_chars: int = Field(2, ge=1, description="Shorter messages are quarantined")  # one character carries no intent
    # Banking77's longest message is 433 characters; 1000 leaves room for real messages
    # while catching pasted e-mail threads and log dumps.
    max_chars: int = Field(1000, ge=10, description="Longer messages are quarantined")
    # A message without a label is not a defect: "review" sends it to clean's ``unlabeled/``
    # output, masked by desensitize like every message, pre-labeled by label QA and queued
    # for review by uncertainty (quality/unlabeled.py); "quarantine" quarantines it (reason
    # ``missing_label``), as before 2026-12-06.
    unlabeled: Literal["review", "quarantine"] = Field(
        "review", description="Messages without a label: pre-label and queue them for review "
        "(review) or quarantine them (quarantine)")


class DedupConfig(_Section):
    # 5-byte shingles: short chat messages (median 46 chars) still get ~40 shingles;
    # k <= 8 lets each shingle be packed into one int64 with no hash collisions.
    shingle_k: int = Field(5, ge=2, le=8)
    # Jaccard at or above this merges two messages. 0.8 keeps one-word edits of normal
    # messages while leaving distinct messages of the same intent apart.
    threshold: float = Field(0.8, gt=0.0, le=1.0, description="Jaccard similarity of shingles at "
                             "or above which two messages are near-duplicates")
    # 20 bands x 5 rows, a pair is a candidate when it collides in at least 2 bands:
    # P(candidate) is 0.996 at J=0.8, 0.13 at J=0.5 and 0.001 at J=0.3, so candidates
    # stay near-linear in the input while recall at the threshold stays high. Measured at
    # 1M rows against 30 x 6 (P = 0.9987 / 0.08 / 0.0002): dedup 16% faster (fewer hashes
    # and bucket rows; 25% more candidate pairs to verify), near-duplicate recall 0.99996
    # instead of 1.0, the same precision (docs/BENCHMARKS.md).
    num_bands: int = Field(20, ge=1)
    rows_per_band: int = Field(5, ge=1)
    min_band_hits: int = Field(2, ge=1)
    # A bucket larger than this (a template message sent thousands of times) is paired in a
    # star around its smallest id instead of all pairs, bounding work at O(n) per bucket.
    max_bucket_pairs: int = Field(50, ge=2)
    # Connected components of the verified edges run on the driver (scipy); fail loudly
    # instead of exhausting driver memory on a pathological input.
    max_driver_edges: int = Field(20_000_000, ge=1)
    seed: int = 42

    @model_validator(mode="after")
    def _hits_fit_bands(self) -> DedupConfig:
        if self.min_band_hits > self.num_bands:
            raise ValueError(
                f"dedup.min_band_hits={self.min_band_hits} exceeds dedup.num_bands={self.num_bands}"
            )
        return self


class DesensitizeConfig(_Section):
    # placeholder: "<EMAIL>", "<CARD>" ... (nothing recoverable, nothing linkable);
    # pseudonym: "<EMAIL_3f9a1c2b7d>", a keyed HMAC of the value, so the same customer's
    # email maps to the same token in every row and run (joins and counts still work)
    # while different keys give unrelated tokens.
    mode: Literal["placeholder", "pseudonym"] = Field(
        "placeholder", description="placeholder: <EMAIL>, <CARD>...; pseudonym: a keyed HMAC "
        "token per value (needs the Airflow connection intentops_pseudonym)")
    # The pseudonymization key is never read from config files or the repo: only from this
    # environment variable, which the DAG fills from the Airflow connection
    # `intentops_pseudonym` (its password) when that connection exists.
    key_env: str = "INTENTOPS_PSEUDONYM_KEY"
    # Masked example texts per entity type kept in the stage report.
    samples_per_type: int = Field(3, ge=0, le=50)


class ValidationConfig(_Section):
    # Gate thresholds on the desensitized training candidates (DAG params override them).
    max_duplicate_rate: float = Field(0.01, ge=0.0, le=1.0, description="Gate: largest share of "
                                      "rows whose normalized text repeats after dedup")
    max_residual_pii_rate: float = Field(0.0, ge=0.0, le=1.0, description="Gate: largest share "
                                         "of rows still matching a PII pattern after masking")
    min_rows: int = Field(1, ge=0)


class LabelQAConfig(_Section):
    # Consensus label per item: Dawid-Skene EM (annotators weighed by estimated
    # reliability) or plain majority vote (ties: the most accurate annotator's label).
    consensus: Literal["dawid_skene", "majority"] = "dawid_skene"
    # Folds of the cross-validated TF-IDF + logistic regression that gives the
    # out-of-sample probabilities confident learning needs.
    cv_folds: int = Field(5, ge=2, le=20)
    max_features: int = Field(200_000, ge=1000)
    max_iter: int = Field(15, ge=1)  # saga epochs (see labelqa.oof_probabilities)
    # An item is a suspect when the posterior of its consensus label (model prior x
    # annotator likelihood) is below this, or cleanlab flags it. 0.9 was the best
    # precision/recall trade-off on builder data at 5% and 10% noise (docs/BENCHMARKS.md).
    min_label_quality: float = Field(0.9, gt=0.0, le=1.0)
    # What the curated training set does with suspects: drop them, take the suggested
    # label, or keep them with `downweight` as sample weight.
    suspects: Literal["exclude", "relabel", "downweight"] = Field(
        "exclude", description="What the curated training set does with suspect labels: leave "
        "them out, take the suggested label, or keep them with a low sample weight")
    downweight: float = Field(0.2, ge=0.0, le=1.0)
    # train / val / test shares of the stratified split (whole dedup clusters at a time).
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    seed: int = 42
    # Agreement (alpha, kappa, item agreement) counts independent annotators only: the
    # label column (``_export``) and dedup copies (``_dedup_copy``) are not annotators.
    # It is computed when at least this many items have two or more of them, and skipped
    # with a note otherwise (a handful of such items gives an alpha that means nothing).
    min_agreement_items: int = Field(200, ge=2, description="Label QA: fewest items with two or "
                                     "more independent annotators for agreement (alpha, kappa) "
                                     "to be computed and gated; fewer: skipped with a note")
    # Gate (DAG params override): Krippendorff's alpha at least this (skipped, with a
    # note, when agreement is skipped: see min_agreement_items), suspects at most this share.
    min_alpha: float = Field(0.8, ge=-1.0, le=1.0, description="Label QA gate: smallest "
                             "Krippendorff's alpha of the annotators (skipped when fewer than "
                             "min_agreement_items items have two or more independent annotators)")
    max_suspect_rate: float = Field(0.05, ge=0.0, le=1.0, description="Label QA gate: largest "
                                    "share of items whose label is suspect (the relabel queue)")
    # Gate: share of items whose dedup cluster merged copies with different labels
    # (``label_conflict``). Measured on demo builds (20,000 rows, seed 7, 16,833 items
    # after dedup): 0.021 (356 items) at the builder's default 8% label errors, 0.056
    # (949) at 25%; 0.05 passes the demo with 2.4x margin and fails the 25% export.
    # It scales with the duplicate share as well as the label noise.
    max_conflict_rate: float = Field(0.05, ge=0.0, le=1.0, description="Label QA gate: largest "
                                     "share of items whose duplicates carry a different label "
                                     "(dedup label conflicts)")

    # Feedback labels of served predictions (quality/feedback.py): "train" adds the dataset's
    # labelled, masked predictions to the curated train split (never to validation or test;
    # duplicates of any curated message left out); "off" ignores them.
    feedback: Literal["train", "off"] = Field(
        "train", description="Label QA: add served predictions that got a true label through "
        "the feedback endpoint to the train split (train) or not (off)")

    @field_validator("split")
    @classmethod
    def _shares(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if min(v) < 0 or abs(sum(v) - 1.0) > 1e-6 or v[0] <= 0:
            raise ValueError(f"labelqa.split must be three non-negative shares summing to 1 with train > 0, not {v}")
        return v


class LabelingConfig(_Section):
    """The review loop with Label Studio (quality/review_stage.py): the relabel queue goes
    to a project there, reviewed labels come back as the ``reviewer`` annotation source."""

    # auto: push when a Label Studio is configured (``url``, INTENTOPS_LABEL_STUDIO_URL, or
    # the entry `make up` writes in var/services/credentials.json), skip saying why when
    # none is; on: no Label Studio fails the task; off: skip, saying it is turned off.
    enabled: Literal["auto", "on", "off"] = Field(
        "auto", description="Send the relabel queue to Label Studio: auto (when one is "
        "configured), on (required), off")
    # Empty: INTENTOPS_LABEL_STUDIO_URL, else the local service of `make up`.
    url: str = ""
    # Empty: intentops-<dataset>, one project per dataset.
    project: str = ""
    # Items sent per round: a reviewer's sitting, not the whole queue at once (the
    # most valuable first; the rest waits for the next round).
    batch_size: int = Field(200, ge=1, le=100_000, description="Review items sent to Label "
                            "Studio per round, most valuable first")
    # Value of a review = score (1 - label quality: the chance the label is wrong) x
    # (1 + class_balance_weight x rarity of the suggested class), rarity = 1 - its share of
    # the largest class. 0 ranks by score alone.
    class_balance_weight: float = Field(0.5, ge=0.0, le=10.0)
    # How long the DAG's review_pull sensor waits for new reviews after the push before it
    # skips (reviews finished later are pulled by the next run's sensor, or by
    # `intentops review-pull`); 0: one poll. Bounded by the sensor's own 2 h timeout.
    pull_wait_minutes: int = Field(5, ge=0, le=120, description="Minutes the review_pull "
                                   "sensor waits for new Label Studio reviews after the push")
    # HTTP timeout per request to Label Studio, seconds.
    timeout_s: float = Field(30.0, gt=0, le=600)
    # Who suggests a label for a message without one, in the tasks the push sends: champion
    # (the registry's champion, its int8 build, when its label set is the run's; label QA's
    # text classifier otherwise, saying why) or labelqa (always label QA's classifier).
    prelabel: Literal["champion", "labelqa"] = Field(
        "champion", description="Pre-labels of unlabeled messages: the serving champion (when "
        "there is one with the run's label set) or label QA's text classifier")


class TrackingConfig(_Section):
    # MLflow tracking server; MLFLOW_TRACKING_URI in the environment wins. Empty: a local
    # SQLite store under var/mlflow (what `make mlflow` serves).
    uri: str = ""
    # Empty: follows the dataset (intentops-<dataset>-data-quality).
    data_quality_experiment: str = ""


class TrainingHParams(_Section):
    """Training hyper-parameters: the one definition the config, the DAG's trigger form and
    the torchrun workers (``training.train``, which reads them back from a JSON file) share.

    The defaults fine-tune the pretrained MiniLM for two epochs, in bf16 where the hardware
    has it (1.45-1.7x faster than fp32 on an AVX512-BF16 CPU; 8-15x slower on a CPU without
    it, hence ``auto``): on Banking77's official test split, which the demo's
    export never sees, one epoch reached 0.908 and two 0.930-0.932 (docs/BENCHMARKS.md, issue 21).
    Peak lr 2e-4, not 1e-4: measured on the demo data,
    one epoch at 1e-4 reached 0.891 test accuracy and its int8 build agreed with fp32 on
    only 98.6% of rows (the export gate wants 99%); at 2e-4, 0.929 and 99.1-99.3% (two
    epochs at 1e-4: 0.934 and 99.4%, at twice the time). See docs/BENCHMARKS.md.
    Unknown keys are rejected: a misspelt ``grad_acum_steps`` silently falling back to its
    default would train a different model than the one the config claims."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    model: Literal["minilm", "small"] = Field(
        "minilm", description="minilm: fine-tune the pretrained MiniLM encoder (the demo default); "
        "small: a small encoder from scratch (fast, for tests).")
    max_length: int = Field(64, ge=8, le=512, description="Tokens per message, truncated beyond.")
    epochs: int = Field(2, ge=1, le=50, description="Training epochs.")
    batch_size: int = Field(16, ge=1, description="Examples per process per optimizer micro-step.")
    grad_accum_steps: int = Field(1, ge=1, description="Micro-steps per optimizer step.")
    lr: float = Field(2e-4, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1, description="Share of steps with a rising learning rate.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Gradient clipping norm; empty disables clipping.")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Autocast precision of the forward pass; auto: bf16 where the device "
        "computes it natively (a CUDA GPU with bf16, a CPU with AVX512-BF16 or AMX), else fp32.")
    checkpoint_every_steps: int = Field(100, ge=1, description="Optimizer steps between checkpoints.")
    early_stopping_patience: int | None = Field(
        2, ge=1, description="Evaluations without improvement before stopping; empty disables.")
    early_stopping_metric: Literal["macro_f1", "accuracy"] = "macro_f1"
    seed: int = 42
    max_steps: int | None = Field(
        None, ge=1, description="Training budget: stop after this many optimizer steps (none: no cap)")
    num_threads: int | None = Field(None, ge=1, description="Torch threads per process; empty: cores // world size.")
    dropout: float = Field(0.1, ge=0, lt=1)
    eval_batch_size: int | None = Field(None, ge=1, description="Empty: 2 * batch_size.")
    # Off by default: measured on Banking77's official test split (fused AdamW, 2 cores),
    # grouping by length made two epochs 1.54x faster (296 against 455 s) but cost 0.6
    # accuracy points (0.9242 against 0.9300; docs/BENCHMARKS.md, issue 21). For long,
    # uneven texts, where padding dominates, it is worth trying.
    length_grouping: int = Field(
        0, ge=0, description="Batches of similar length: each run of this many batches of the "
        "shuffled order is sorted by length, then the batches are shuffled (0: off).")
    # Gradient compression (training/comm.py): a DDP communication hook. bf16 needs NCCL
    # (GPUs) and is refused on gloo; powersgd sends two rank-`powersgd_rank` factors per
    # weight matrix after `powersgd_start_iter` plain all-reduces.
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = Field(
        "none", description="Gradient compression between processes: none, fp16, bf16 (NCCL "
        "only) or powersgd.")
    powersgd_rank: int = Field(2, ge=1, le=64, description="PowerSGD matrix approximation rank.")
    powersgd_start_iter: int = Field(
        10, ge=2, description="PowerSGD: plain all-reduces before compression starts (>= 2).")
    # Data prefetch (training/state.py): DataLoader worker processes tokenize-free batches
    # (padding, collation) ahead of the step. They change speed, never the result, so like
    # num_threads they are not part of a checkpoint's identity. Memory is pinned only when
    # CUDA is present.
    num_workers: int = Field(0, ge=0, le=32, description="DataLoader worker processes per "
                             "training process (0: batches built in the training process).")
    prefetch_factor: int = Field(2, ge=1, le=64, description="Batches each worker prepares ahead.")
    persistent_workers: bool = Field(False, description="Keep the workers between epochs.")

    @model_validator(mode="after")
    def _workers(self) -> TrainingHParams:
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers needs num_workers > 0")
        return self


class SearchConfig(_Section):
    """An optional Optuna study before training (training/search.py): each trial trains
    with one choice per searched setting for `trial_epochs`, scored by the best validation
    `hparams.early_stopping_metric`; trials that trail the median of earlier ones at the same
    epoch are pruned (SIGTERM, the preemption path). The budget is `trials` and
    `timeout_seconds`, whichever ends first; the best trial's settings train the model.
    A list left empty is not searched."""

    enabled: bool = False
    trials: int = Field(8, ge=1, le=500)
    timeout_seconds: float = Field(3600.0, gt=0)
    trial_epochs: int | None = Field(None, ge=1, le=50, description="Epochs per trial (empty: hparams.epochs)")
    pruning: bool = True
    seed: int = 0
    lr: list[float] = Field(default_factory=lambda: [1e-4, 2e-4, 5e-4])
    batch_size: list[int] = Field(default_factory=list)
    dropout: list[float] = Field(default_factory=list)
    weight_decay: list[float] = Field(default_factory=list)

    def space(self) -> dict[str, list[Any]]:
        return {k: list(getattr(self, k)) for k in ("lr", "batch_size", "dropout", "weight_decay")
                if getattr(self, k)}

    @model_validator(mode="after")
    def _space(self) -> SearchConfig:
        if self.enabled and not self.space():
            raise ValueError("training.search.enabled needs at least one of lr, batch_size, "
                             "dropout, weight_decay to list choices")
        return self


class TrainingConfig(_Section):
    # torchrun process group: processes per node (gloo on CPU, nccl with CUDA), nodes, and
    # for multi-node a c10d rendezvous endpoint (host:port). One process by default: two
    # epochs of MiniLM reached 0.932 on Banking77's official test split with one process
    # (batch 16) and 0.9265 with two (global batch 32, half the optimizer steps), at 10 vs
    # 12 min (docs/BENCHMARKS.md, issue 21). More cores, GPUs or nodes: raise it.
    nproc_per_node: int = Field(1, ge=1)
    # A number, or an elastic range "MIN:MAX": torchrun keeps training while at least MIN
    # nodes take part; a lost node triggers a re-rendezvous and the survivors resume from
    # the last checkpoint at the smaller world size (training/state.py, resize).
    nnodes: int | str = Field(1, description="Nodes: N, or an elastic range MIN:MAX")
    # Empty (the default): the DAG starts nodes 1..MAX-1 as `train_node` tasks on the
    # training queue (pool intentops_training_nodes), and the train task's launcher hosts
    # the c10d rendezvous on a free port of its worker (INTENTOPS_NODE_ADDR, else the host
    # name). Set (host:port): launchers started outside the DAG join this rendezvous.
    rdzv_endpoint: str = ""
    # How long a launcher waits at the rendezvous for the other nodes, and how long a
    # train_node task waits for the train task's launch plan (or its retry's).
    rdzv_join_timeout_seconds: float = Field(600.0, gt=0, le=86400)
    node_wait_seconds: float = Field(900.0, gt=0, le=86400)
    # torchrun restarts the group this often after a worker dies; each restart (and each
    # Airflow retry) resumes from the newest checkpoint.
    max_restarts: int = Field(1, ge=0)
    # Sharing (training/preempt.py): a waiting training of higher priority preempts a running
    # one of lower priority (e.g. a production retrain 100, an experiment 1; equals never
    # preempt each other). The preempted trainer checkpoints and exits within one optimizer
    # step; after `preempt_grace_seconds` the controller kills it. Its task is rescheduled
    # (no retry used up) `reschedule_seconds` later and resumes from the checkpoint. At
    # least 15 s: Airflow (3.x, apache/airflow#71172) uses up a retry when the executor's
    # report of the rescheduled attempt arrives after the task went back to `scheduled`,
    # and that report took 6 s on a busy 2-core host.
    priority: int = Field(1, ge=0, le=1000, description="Preemption priority of this run's "
                          "training (a production retrain outranks an experiment)")
    preempt_grace_seconds: float = Field(120.0, gt=0, le=3600)
    reschedule_seconds: float = Field(60.0, ge=15, le=86400)
    # "Serve by day, train by night": training starts only inside this daily window
    # ("22:00-06:00", host local time; empty: any time; the train task is rescheduled to
    # the window's opening), and the autoscaler holds serving at its minimum replicas in it.
    window: str = Field("", description="Daily window training may start in, HH:MM-HH:MM "
                        "(e.g. 22:00-06:00); empty: any time")

    @field_validator("window")
    @classmethod
    def _window(cls, v: str) -> str:
        from core import timewindow

        timewindow.parse(v)
        return v.strip()
    hparams: TrainingHParams = Field(default_factory=lambda: TrainingHParams())

    @field_validator("nnodes", mode="before")
    @classmethod
    def _nnodes(cls, v: Any) -> int | str:
        text = str(v).strip()
        m = re.fullmatch(r"(\d+)(?::(\d+))?", text)
        lo, hi = (int(m[1]), int(m[2] or m[1])) if m else (0, 0)
        if not m or lo < 1 or hi < lo:
            raise ValueError(f"nnodes {v!r}: expected a number >= 1 or a range MIN:MAX with "
                             "1 <= MIN <= MAX")
        return lo if lo == hi else f"{lo}:{hi}"

    @property
    def nnodes_range(self) -> tuple[int, int]:
        lo, _, hi = str(self.nnodes).partition(":")
        return int(lo), int(hi or lo)

    search: SearchConfig = Field(default_factory=lambda: SearchConfig())
    # Empty: follow the dataset (intentops-<dataset>-training, intentops-<dataset>): two
    # datasets in one installation never share a model name, experiment or alias.
    experiment: str = ""
    registered_model: str = ""
    # Registration gate: the challenger must pass the behavioural checks and beat the
    # champion's `metric` by `margin`.
    metric: Literal["test_accuracy", "test_macro_f1"] = "test_accuracy"
    margin: float = Field(0.0, ge=-1.0, le=1.0, description="Register only when the metric beats "
                          "the champion's by at least this (negative: a challenger this much below "
                          "the champion still registers, e.g. a retrain on fresher data)")
    # Behavioural checks (training/behaviour.py), run by the register stage. The two
    # invariances (PII placeholders, casing) run on `behaviour_sample` messages of the
    # curated val split and must keep `min_invariance` of the predictions unchanged.
    min_invariance: float = Field(0.95, ge=0.0, le=1.0)
    min_functionality: float = Field(0.8, ge=0.0, le=1.0)
    behaviour_sample: int = Field(500, ge=10)
    # The PII-placeholder invariance runs only when at least this share of the training
    # rows holds a placeholder: a model that saw placeholders in fewer rows had no chance
    # to learn they carry no intent, and traffic masked the same way holds them as rarely.
    # 1% is 100 rows of a 10,000-row export, spread over the classes (the demo has ~30%).
    min_placeholder_share: float = Field(
        0.01, ge=0.0, le=1.0, description="PII-placeholder invariance is checked only when at "
        "least this share of training rows holds a placeholder")
    # Minimum-functionality probes: a CSV with columns text,label (labels from the run's
    # label set; relative to the project). Empty: no probes, the check is skipped.
    probes_file: str = Field("", description="CSV of text,label probes the model must get "
                             "right (minimum functionality); empty skips the check")


class ExportConfig(_Section):
    # ONNX opset of the fp32 export (checked against what torch and onnxruntime support).
    opset: int = Field(17, ge=14)
    # fp32 parity: largest |logit(PyTorch) - logit(ONNX Runtime)| on the whole test split.
    parity_atol: float = Field(1e-4, gt=0.0)
    # int8 gate, against the fp32 build on the test split.
    max_accuracy_drop: float = Field(0.005, ge=0.0, le=1.0)
    min_agreement: float = Field(0.99, ge=0.0, le=1.0)
    # The int8 build's out-of-scope decisions (the stored reject threshold applied to its
    # own scores) must agree with the fp32 build's on this share of test rows.
    min_oos_agreement: float = Field(0.99, ge=0.0, le=1.0)
    # Quantization candidates measured on the machine the task runs on: ORT transformer
    # fusions ("none" = the plain export, "full", "no_attention") x per-channel x
    # reduce-range. The fastest at batch 32 among those passing the gate ships.
    fusions: list[Literal["none", "full", "no_attention"]] = Field(
        default_factory=lambda: ["none", "full", "no_attention"], min_length=1)
    per_channel: list[bool] = Field(default_factory=lambda: [False, True], min_length=1)
    reduce_range: list[bool] = Field(default_factory=lambda: [False, True], min_length=1)
    # Speed report: intra-op threads (0 = every core), batch-1 latency samples, batch-32 batches.
    # When no fully quantized candidate passes the gate: keep the feed-forward MatMuls of
    # the first 1..N encoder layers in fp32 (mixed precision), stopping at the first pass;
    # in a graph without BERT layer names (the small encoder), its first 1..N weight MatMuls.
    fallback_fp32_ffn_layers: int = Field(2, ge=0, le=24)
    threads: int = Field(0, ge=0)
    latency_samples: int = Field(200, ge=10)
    throughput_batches: int = Field(20, ge=2)
    candidate_batches: int = Field(6, ge=2)


class AutoscaleConfig(_Section):
    """Replicas of the stable model server (deploy/autoscaler.py): between ``min_replicas``
    and ``max_replicas``, from the router's outstanding requests per replica, the stable
    variant's p99 latency and the replicas' CPU, with cool-downs. ``max_replicas`` 1 (the
    default) runs no autoscaler. Maps onto a Kubernetes HPA (min/max, CPU target,
    stabilization windows) or KEDA (a Prometheus trigger on intentops_router_outstanding)."""

    min_replicas: int = Field(1, ge=1, le=32)
    max_replicas: int = Field(1, ge=1, le=32)
    interval_seconds: float = Field(2.0, gt=0)  # between decisions
    window_seconds: float = Field(10.0, gt=0)  # the latency window read from the router
    # Per replica; above it: scale up (half a micro-batch of 32 waiting or running).
    target_outstanding: float = Field(16.0, gt=0)
    low_outstanding: float = Field(2.0, ge=0)  # per replica; below it (and calm): scale down
    max_p99_ms: float = Field(150.0, gt=0)  # stable p99 above it: scale up
    max_cpu: float = Field(0.9, gt=0, le=1.0)  # busy share of each replica's thread budget
    up_cooldown_seconds: float = Field(10.0, ge=0)
    down_cooldown_seconds: float = Field(30.0, ge=0)
    down_after_seconds: float = Field(20.0, ge=0)  # calm this long before a scale-in

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


class DeployConfig(_Section):
    """Serving and the canary rollout (deploy/). Processes bind to ``host`` (localhost by
    default); state, logs, downloaded builds and generated keys live under ``root``."""

    root: str = "var/deploy"  # each dataset deploys under <root>/<dataset>/
    host: str = "127.0.0.1"
    router_port: int = Field(8200, ge=0, le=65535)  # 0: any free port
    # Canary traffic steps in percent; the last must be 100 (the canary takes all traffic
    # before it is promoted).
    steps: list[int] = Field(default_factory=lambda: [10, 25, 50, 100], min_length=1,
                             description="Canary traffic steps in percent, rising, ending at 100")
    bake_seconds: float = Field(20.0, gt=0, le=3600, description="Seconds of live traffic per "
                                "canary step, at least, before it is judged")
    min_requests: int = Field(40, ge=1)  # canary requests per step before it is judged
    shadow_share: float = Field(0.25, ge=0.0, le=1.0)  # of stable traffic mirrored to the canary
    poll_seconds: float = Field(1.0, gt=0)
    ready_timeout_seconds: float = Field(120.0, gt=0)
    load_concurrency: int = Field(4, ge=1)  # the load generator's closed-loop clients
    # Analysis limits: canary against stable (absolute limits on a first deployment).
    max_error_rate: float = Field(0.01, ge=0.0, le=1.0)
    max_latency_ratio: float = Field(2.0, ge=1.0)  # canary p50/p99 <= ratio x stable's + slack
    latency_slack_ms: float = Field(25.0, ge=0.0)
    max_p99_ms: float = Field(500.0, gt=0)  # first deployment, no stable to compare with
    min_agreement: float = Field(0.8, ge=0.0, le=1.0)  # labels equal to stable's on mirrored traffic
    min_compared: int = Field(20, ge=1)  # mirrored requests before agreement is judged
    max_accuracy_drop: float = Field(0.05, ge=0.0, le=1.0)  # on labeled probe traffic, vs stable
    min_probes: int = Field(30, ge=1)  # labeled probes per variant before accuracy is judged
    # Model servers.
    server_threads: int = Field(1, ge=0)  # ORT intra-op threads per server (two may run)
    max_batch: int = Field(32, ge=1)
    max_delay_ms: float = Field(5.0, ge=0.0)
    max_queue: int = Field(256, ge=1)
    # The router's response cache: answers kept per variant (0: no cache).
    cache_size: int = Field(0, ge=0)
    autoscale: AutoscaleConfig = Field(default_factory=AutoscaleConfig)
    # The prediction log (deploy/predlog.py): every replica writes <lake>/predictions/
    # predictions.db; masked text only. A sampled share of requests, kept by age and count.
    prediction_log: bool = True
    prediction_log_sample: float = Field(1.0, ge=0.0, le=1.0)
    prediction_log_days: float = Field(30.0, gt=0)
    prediction_log_max_rows: int = Field(1_000_000, ge=1)

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if any(not 0 < s <= 100 for s in v) or v != sorted(set(v)) or v[-1] != 100:
            raise ValueError(f"steps must rise strictly within (0, 100] and end at 100, got {v}")
        return v


class SparkConfig(_Section):
    # Used when a job runs outside spark-submit (tests, `intentops clean`). Under Airflow the
    # master comes from the spark_default connection.
    master: str = "local[*]"
    driver_memory: str = "4g"
    # 2 cores: few, larger shuffle partitions beat Spark's default of 200 tiny ones.
    shuffle_partitions: int = Field(8, ge=1)
    java_options: str = Field(
        "", description="Extra JVM options of the driver and executors (spark.driver and "
        "spark.executor extraJavaOptions), e.g. '-XX:TieredStopAtLevel=1' for small inputs: "
        "a spark-submit of a few thousand rows spends about 40% of its CPU in the JIT's "
        "optimizing compiler (docs/BENCHMARKS.md)")

    class_archive: str = Field(
        "", description="A class-data-sharing archive of the Spark JVM's classes, built on this "
        "machine by `intentops spark-archive` (make spark-archive): each spark-submit then maps "
        "the classes instead of loading them, about 7 of the 17 CPU-seconds of an empty job here "
        "(docs/BENCHMARKS.md). A relative path is under the project root; empty, or a file that "
        "does not exist: not used. Built for one JVM and Spark install; rebuild after upgrading "
        "either (a stale archive is refused by the JVM and costs nothing but the saving).")

    def archive_path(self) -> Path | None:
        """``class_archive`` as an absolute path, or None when unset."""
        if not self.class_archive:
            return None
        path = Path(self.class_archive).expanduser()
        return path if path.is_absolute() else PROJECT_ROOT / path

    def java_conf(self) -> dict[str, str]:
        """``java_options`` (and the class archive, when its file exists) as the Spark
        properties that carry them (none when both are empty)."""
        options = self.java_options
        archive = self.archive_path()
        if archive is not None and archive.is_file():
            options = f"{options} -XX:SharedArchiveFile={archive}".strip()
        if not options:
            return {}
        return {f"spark.{role}.extraJavaOptions": options for role in ("driver", "executor")}


DATASET_RE = re.compile(r"[a-z][a-z0-9_-]{0,39}")


class OosConfig(_Section):
    """Out-of-scope requests: the dataset's out-of-scope label, if it has one, and the
    reject threshold on the model's confidence (``contract.reject``), calibrated on the
    validation split and stored in the build."""

    label: str | None = Field(
        None, description="The label of out-of-scope messages in the data (e.g. oos; matched "
        "after label normalization, like every label); empty: "
        "the label set has none, and a message below the threshold is answered with no label")
    target_in_scope_recall: float = Field(
        0.97, gt=0, le=1, description="Share of in-scope validation messages the threshold "
        "must keep answering in scope")
    min_calibration_rows: int = Field(
        200, ge=10, description="In-scope validation messages needed to calibrate; fewer: no threshold")
    max_recall_drop: float = Field(
        0.02, ge=0, le=1, description="Registry and canary gates: the out-of-scope recall a "
        "challenger may lose against the champion (when the label set has the label)")


class InstanceType(_Section):
    """One machine type of the price table: its size and its hourly prices."""

    cores: float = Field(gt=0, description="vCPUs")
    memory_gib: float = Field(gt=0)
    gpus: int = Field(0, ge=0)
    on_demand_per_hour: float = Field(ge=0)
    spot_per_hour: float | None = Field(None, ge=0, description="Empty: no spot offer")


def _example_instances() -> dict[str, InstanceType]:
    # EXAMPLE prices, to replace with your own: roughly the AWS us-east-1 Linux on-demand
    # list prices (USD per hour) of a few general-purpose and GPU types; spot prices move
    # by the hour and are only indicative.
    return {
        "m7i.large": InstanceType(cores=2, memory_gib=8, on_demand_per_hour=0.1008, spot_per_hour=0.04),
        "m7i.xlarge": InstanceType(cores=4, memory_gib=16, on_demand_per_hour=0.2016, spot_per_hour=0.08),
        "c7i.large": InstanceType(cores=2, memory_gib=4, on_demand_per_hour=0.0893, spot_per_hour=0.035),
        "g5.xlarge": InstanceType(cores=4, memory_gib=16, gpus=1, on_demand_per_hour=1.006,
                                  spot_per_hour=0.40),
    }


class CostConfig(_Section):
    """The price table that turns the resources each stage recorded (its manifest's
    ``resources``) into money (``core/cost.py``): per stage, per run and per 1,000
    predictions of each ONNX build. Not part of any stage's key: changing a price never
    reruns a stage. The defaults are EXAMPLE prices (see ``_example_instances``), to be
    replaced with your provider's."""

    currency: str = "USD"
    instance_types: dict[str, InstanceType] = Field(default_factory=_example_instances, min_length=1)
    # What the stages run on (one instance type for all, or per stage, e.g. {"train": "g5.xlarge"}).
    pipeline_instance: str = "m7i.large"
    stage_instances: dict[str, str] = Field(default_factory=dict)
    spot: bool = Field(False, description="The pipeline's instances are spot instances")
    # What serves the model: prices the per-1,000-predictions figures.
    serving_instance: str = "m7i.large"
    serving_spot: bool = False
    # share: a stage pays for the share of the instance it used (the largest of its CPU
    # core-seconds / cores, GPU-seconds / GPUs and peak memory / memory x wall time), as on
    # shared capacity; wall: it holds the whole instance for its wall time.
    basis: Literal["share", "wall"] = "share"
    # Object storage for the lake's outputs (S3 Standard lists 0.023 per GB-month), kept
    # for this many months, and data moved: bytes a stage read, at e.g. 0.01 per GB between
    # zones (internet egress is about 0.09). GB here is 2^30 bytes, as the providers bill.
    storage_per_gb_month: float = Field(0.023, ge=0)
    storage_months: float = Field(1.0, ge=0)
    transfer_per_gb: float = Field(0.01, ge=0)

    @model_validator(mode="after")
    def _known_instances(self) -> CostConfig:
        from core.stages import NAMES  # the stage registry (imports no config at run time)

        named = {"cost.pipeline_instance": self.pipeline_instance,
                 "cost.serving_instance": self.serving_instance,
                 **{f"cost.stage_instances.{k}": v for k, v in self.stage_instances.items()}}
        for where, name in named.items():
            if name not in self.instance_types:
                raise ValueError(f"{where}: {name!r} is not in cost.instance_types "
                                 f"({', '.join(sorted(self.instance_types))})")
        unknown = sorted(set(self.stage_instances) - set(NAMES))
        if unknown:
            raise ValueError(f"cost.stage_instances: no stage {', '.join(unknown)}; the stages are "
                             f"{', '.join(NAMES)}")
        for spot, names in ((self.spot, [self.pipeline_instance, *self.stage_instances.values()]),
                            (self.serving_spot, [self.serving_instance])):
            missing = sorted({n for n in names if self.instance_types[n].spot_per_hour is None})
            if spot and missing:
                raise ValueError(f"spot is on but {', '.join(missing)} has no spot_per_hour")
        return self


class MonitoringConfig(_Section):
    """The monitoring DAG (``dags/intentops_monitoring.py``): the served traffic of the last
    ``window_hours`` against the champion's training data, and the assets that start a
    retraining run. Thresholds pair a p-value with an effect size: a long window makes
    any tiny difference "significant", and a shift too small to matter must not retrain."""

    window_hours: float = Field(1.0, gt=0, le=24 * 31, description="Hours of served traffic "
                                "each check reads (the window ends at the check's time)")
    # Below this the tests have no power and a noisy window would alarm: the check says
    # "too little traffic" and emits nothing.
    min_predictions: int = Field(200, ge=20, description="Fewest logged predictions in the "
                                 "window for a drift verdict")
    # Embedding drift runs on a sample of each side: its cost does not grow with traffic.
    embedding_sample: int = Field(1000, ge=50, le=20000, description="Messages of the window "
                                  "embedded for the novelty test")
    reference_sample: int = Field(3000, ge=100, le=50000, description="Reference messages "
                                  "embedded (once per champion): a third calibrates, the rest is the neighbour bank")
    # alpha is per test; the check runs four (Bonferroni: about 1 false alarm per 1,000
    # windows at 1e-3 is the target, so each test gets a quarter of it).
    alpha: float = Field(2.5e-4, gt=0, lt=0.5, description="p-value below which a test counts "
                         "as shifted (per test)")
    novelty_quantile: float = Field(0.95, ge=0.5, lt=1.0, description="Quantile of the reference's "
                                    "nearest-neighbour distance beyond which a message counts as novel")
    min_novel_excess: float = Field(0.03, gt=0, le=1.0, description="Share of novel messages above "
                                    "the reference's that counts as embedding drift")
    min_label_tvd: float = Field(0.15, gt=0, le=1.0, description="Total variation distance "
                                 "between predicted and training label shares that counts as a shift")
    min_confidence_ks: float = Field(0.1, gt=0, le=1.0, description="KS statistic of the "
                                     "confidence against the baseline that counts as a shift")
    min_oos_rate_change: float = Field(0.05, gt=0, le=1.0, description="Absolute change of the "
                                       "out-of-scope rate against the baseline that counts as a shift")
    baseline_hours: float = Field(168.0, gt=0, description="Hours of the same model version's "
                                  "traffic before the window: the confidence and out-of-scope baseline")
    min_feedback: int = Field(50, ge=1, description="Feedback rows in the window before live "
                                 "accuracy is judged")
    min_live_accuracy: float = Field(0.7, ge=0.0, le=1.0, description="Live accuracy on feedback "
                                     "below which the check reports drift")
    min_new_labels: int = Field(200, ge=1, description="Feedback labels since the last "
                                "new-labels event that emit the next one")
    min_review_rows: int = Field(500, ge=1, description="Unlabeled out-of-scope or abstained "
                                 "predictions since the last review event that emit the next one")
    reference_path: str = Field("", description="Curated Parquet (label-QA output) to compare "
                                "with; empty: the champion's training set, found through the registry")
    seed: int = 42


class PipelineConfig(_Section):
    # The dataset this config describes. The lake prefix (<lake_root>/<dataset>/), the
    # registered model name, the MLflow experiments and the deployment folder follow from
    # it, so datasets live side by side in one installation.
    dataset: str = Field("banking77", description="Name of the dataset: a lower-case identifier "
                         "(letters, digits, - and _) from which the model name, the lake folder, "
                         "the MLflow experiments and the deployment follow")
    lake_root: str = "var/lake"
    input: InputConfig = Field(default_factory=InputConfig)
    clean: CleanConfig = Field(default_factory=CleanConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    desensitize: DesensitizeConfig = Field(default_factory=DesensitizeConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    labelqa: LabelQAConfig = Field(default_factory=LabelQAConfig)
    labeling: LabelingConfig = Field(default_factory=LabelingConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    oos: OosConfig = Field(default_factory=OosConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    deploy: DeployConfig = Field(default_factory=DeployConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)

    @model_validator(mode="before")
    @classmethod
    def _dataset_defaults(cls, data: Any) -> Any:
        """Names left empty follow the dataset (a saved config has them filled in)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        ds = data.get("dataset") or "banking77"
        if not isinstance(ds, str) or not DATASET_RE.fullmatch(ds):
            raise ValueError(f"dataset {ds!r} is not a safe name: 1 to 40 lower-case letters, "
                             "digits, '-' or '_', starting with a letter")
        for section, key, value in (("training", "registered_model", f"intentops-{ds}"),
                                    ("training", "experiment", f"intentops-{ds}-training"),
                                    ("tracking", "data_quality_experiment", f"intentops-{ds}-data-quality")):
            sec = data.get(section)
            if sec is None or isinstance(sec, dict):
                sec = dict(sec or {})
                if not sec.get(key):
                    sec[key] = value
                data[section] = sec
        return data

    @field_validator("lake_root")
    @classmethod
    def _not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("lake_root must not be empty")
        return v

    @model_validator(mode="after")
    def _columns_distinct(self) -> PipelineConfig:
        cols = [c for c in self.input.columns.model_dump().values() if c]
        if len(cols) != len(set(cols)):
            raise ValueError(f"input.columns maps two fields to one column: {cols}")
        return self

    def resolve_path(self, p: str) -> Path:
        """Relative paths in the config are relative to the project root, so a run works
        the same from any working directory (Airflow runs tasks from a temp dir)."""
        path = Path(p)
        return path if path.is_absolute() or "://" in p else PROJECT_ROOT / path

    @property
    def deploy_dir(self) -> Path:
        """This dataset's deployment: state, logs, builds and keys under <deploy.root>/<dataset>/."""
        return self.resolve_path(self.deploy.root) / self.dataset

    @property
    def lake(self) -> Path:
        """This dataset's lake: stage outputs and run records under <lake_root>/<dataset>/."""
        return self.resolve_path(self.lake_root) / self.dataset


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.lower().split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def _parse_scalar(raw: str) -> Any:
    # YAML scalars: "0.85" -> float, "true" -> bool, "csv" -> str, '{"a": 1}' -> dict.
    return yaml.safe_load(raw)


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> PipelineConfig:
    """Resolve the configuration. ``overrides`` maps dotted keys (``dedup.threshold``) or
    nested dicts onto fields; unknown keys are an error, not silently ignored."""
    env = dict(os.environ if env is None else env)
    file = Path(path or env.get("INTENTOPS_CONFIG") or DEFAULT_CONFIG_FILE)
    data: dict[str, Any] = {}
    if file.exists():
        loaded = yaml.safe_load(file.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{file}: expected a mapping at the top level")
        data = loaded
    elif path is not None:
        raise FileNotFoundError(f"config file not found: {file}")
    env_over: dict[str, Any] = {}
    for key, raw in env.items():
        if key.startswith(ENV_PREFIX):
            _set_dotted(env_over, key[len(ENV_PREFIX) :].replace("__", "."), _parse_scalar(raw))
    data = _deep_merge(data, env_over)
    explicit: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        nested: dict[str, Any] = {}
        _set_dotted(nested, key, value)
        explicit = _deep_merge(explicit, nested)
    data = _deep_merge(data, explicit)
    return PipelineConfig.model_validate(data)


def config_from_json(text: str) -> PipelineConfig:
    return PipelineConfig.model_validate(json.loads(text))
