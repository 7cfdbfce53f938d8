"""Distributed training: real torchrun runs, SIGKILL + resume, checkpoints, bad input, MiniLM.

Every test trains on a tiny curated set built from the Banking77 CSVs in ``data/banking77``
(five well-populated classes), with the small from-scratch encoder so a run takes seconds
on two CPU cores. Nothing is mocked: the runs are real ``torchrun`` process groups (gloo),
the kill is a real SIGKILL of the launcher's process group, MLflow is a real server.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pydantic
import pytest
import torch

from training import checkpoint as ckpt
from training.data import (
    EncodedDataset,
    PadCollate,
    TrainingDataError,
    check_train_split,
    group_by_length,
    load_curated,
    load_labels,
    load_tokenizer,
    pad_token_id,
)
from training.train import TrainConfig, load_config

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CLASSES = ["age_limit", "apple_pay_or_google_pay", "card_arrival", "exchange_rate", "top_up_failed"]
SMALL = {"model": "small", "max_length": 32, "lr": 1e-3, "warmup_ratio": 0.1, "seed": 7, "epochs": 3,
         "batch_size": 32, "precision": "fp32", "checkpoint_every_steps": 200,
         "early_stopping_patience": None}


def make_curated(root: Path, n_train: int, n_val: int = 15, n_test: int = 20,
                 classes: list[str] = CLASSES) -> tuple[Path, Path]:
    """A curated folder (label-QA layout) and a labels file from the Banking77 CSVs.

    The labels file spells one class the way a CRM export would ("Card Arrival"), so the
    run also checks that the class list is canonicalized like the clean stage does it."""
    train_csv = pd.read_csv(ROOT / "data/banking77/train.csv")
    test_csv = pd.read_csv(ROOT / "data/banking77/test.csv")
    rows: list[tuple[str, str, str]] = []
    for c in classes:
        texts = train_csv[train_csv.category == c].text.sample(frac=1.0, random_state=0).tolist()
        assert len(texts) >= n_train + n_val, c
        rows += [(t, c, "train") for t in texts[:n_train]]
        rows += [(t, c, "val") for t in texts[n_train:n_train + n_val]]
        rows += [(t, c, "test") for t in test_csv[test_csv.category == c].text[:n_test]]
    df = pd.DataFrame(rows, columns=["text", "label", "split"])
    df.insert(0, "record_id", [f"r{i:05d}" for i in range(len(df))])
    df["weight"] = 1.0
    df.loc[df.index % 17 == 0, "weight"] = 0.3  # some down-weighted suspects, as label QA emits
    curated = root / "curated"
    curated.mkdir(parents=True)
    df[["record_id", "text", "label", "weight", "split"]].to_parquet(curated / "part-0.parquet",
                                                                       index=False)
    labels = root / "categories.json"
    labels.write_text(json.dumps([c.replace("card_arrival", "Card Arrival") for c in classes]))
    return curated, labels


def write_config(path: Path, **values: Any) -> Path:
    path.write_text(json.dumps(SMALL | values))
    return path


def train_cmd(curated: Path, labels: Path, out: Path, config: Path, nproc: int = 2) -> list[str]:
    launcher = ([str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}"]
                if nproc > 1 else [sys.executable])
    return [*launcher, "-m", "training.train", "--curated", str(curated), "--labels", str(labels),
            "--out", str(out), "--config", str(config)]


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def history(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]


def metrics(out: Path) -> dict[str, Any]:
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture
def env(project_env: dict[str, str]) -> dict[str, str]:
    """No MLflow tracking URI (training logs nowhere unless a test gives one); the
    registry user's credentials stay, for the tests that do."""
    return {k: v for k, v in project_env.items()
            if not k.startswith("MLFLOW_") or k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}


# --------------------------------------------------------------------------- torchrun


@pytest.mark.e2e
def test_torchrun_two_processes_end_to_end(tmp_path: Path, env: dict[str, str]) -> None:
    curated, labels = make_curated(tmp_path / "data", n_train=60)
    epochs, batch, accum, world = 4, 8, 2, 2
    cfg = write_config(tmp_path / "cfg.json", epochs=epochs, batch_size=batch,
                       grad_accum_steps=accum, lr=2e-3, checkpoint_every_steps=7)
    out = tmp_path / "out"
    t0 = time.monotonic()
    res = run(train_cmd(curated, labels, out, cfg), env)
    assert res.returncode == 0, res.stderr[-4000:]
    first_run_s = time.monotonic() - t0

    m = metrics(out)
    n_train = 60 * len(CLASSES)
    micro = math.ceil(math.ceil(n_train / world) / batch)
    steps_per_epoch = math.ceil(micro / accum)
    assert m["world_size"] == 2
    assert m["steps"] == m["steps_per_epoch"] * epochs == steps_per_epoch * epochs
    assert m["epochs_completed"] == epochs
    steps = [h["step"] for h in history(out)]
    assert steps == list(range(1, m["steps"] + 1))
    assert all(h["lr"] > 0 and h["samples_per_s"] > 0 for h in history(out))
    # DistributedSampler pads each rank's shard to ceil(N / W) rows, and every one is trained.
    assert m["train_samples"] == epochs * math.ceil(n_train / world) * world
    assert m["test_accuracy"] >= 0.6, m["test_accuracy"]  # chance is 0.2
    assert m["test_macro_f1"] >= 0.5
    assert m["precision"] == "fp32" and m["train_samples_per_s"] > 0
    assert len(m["val_history"]) == epochs and m["best_epoch"] is not None
    assert sum(map(sum, m["confusion_matrix"])) == m["test_rows"] == 20 * len(CLASSES)
    assert m["classification_report"]["accuracy"] == pytest.approx(m["test_accuracy"])
    assert m["labels"] == sorted(CLASSES)

    model_dir = out / "model"
    for name in ("model.pt", "model_config.json", "tokenizer.json", "labels.json"):
        assert (model_dir / name).is_file(), name
    assert json.loads((model_dir / "labels.json").read_text()) == sorted(CLASSES)
    assert (out / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "done").is_file()
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept[-1] == f"step-{m['steps']:08d}.pt" and len(kept) == 3 and "best.pt" in kept

    # The shipped model rebuilds from its folder alone and scores the test split the same.
    from training.models import load_trained
    from training.train import DistContext, evaluate

    model, spec = load_trained(model_dir)
    assert spec["kind"] == "small" and spec["labels"] == sorted(CLASSES)
    tok = load_tokenizer(spec["max_length"])
    splits = load_curated(curated, load_labels(labels))
    test_ds = EncodedDataset(splits["test"], spec["labels"], tok)
    ctx = DistContext(0, 1, 0, torch.device("cpu"), False)
    again = evaluate(model, test_ds, ctx, TrainConfig(**SMALL), PadCollate(pad_token_id(tok)))
    assert again is not None and again["accuracy"] == pytest.approx(m["test_accuracy"])

    # Idempotent: a second launch sees the done marker and leaves everything as it was.
    before = (out / "metrics.json").stat().st_mtime_ns
    t0 = time.monotonic()
    res2 = run(train_cmd(curated, labels, out, cfg), env)
    assert res2.returncode == 0, res2.stderr[-2000:]
    assert "already finished" in res2.stderr
    assert (out / "metrics.json").stat().st_mtime_ns == before
    assert time.monotonic() - t0 < first_run_s


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.e2e
def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path: Path, env: dict[str, str]) -> None:
    curated, labels = make_curated(tmp_path / "data", n_train=90)
    epochs, batch, every = 6, 8, 12
    cfg = write_config(tmp_path / "cfg.json", epochs=epochs, batch_size=batch,
                       checkpoint_every_steps=every, num_threads=1)
    per_epoch = math.ceil(math.ceil(90 * len(CLASSES) / 2) / batch)

    ref = tmp_path / "uninterrupted"
    res = run(train_cmd(curated, labels, ref, cfg), env)
    assert res.returncode == 0, res.stderr[-4000:]

    out = tmp_path / "killed"
    cmd = train_cmd(curated, labels, out, cfg)
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    try:
        # Wait for a checkpoint in the middle of an epoch (not an epoch-end one) past half-way.
        while True:
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no mid-epoch checkpoint appeared"
            steps = [s for s, _ in ckpt.step_checkpoints(out / "checkpoints")]
            if any(s > 2 * per_epoch and s % per_epoch for s in steps):
                break
            time.sleep(0.05)
        workers = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "done").exists()
    # torchrun puts each worker in a session of its own; they must still die with it,
    # or they would keep writing checkpoints under the restarted run.
    gone_by = time.monotonic() + 15
    while any(_alive(p) for p in workers) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert workers and not any(_alive(p) for p in workers)
    killed_at = max(h["step"] for h in history(out))
    assert killed_at < metrics(ref)["steps"]

    res = run(cmd, env)
    assert res.returncode == 0, res.stderr[-4000:]
    found = re.search(r"resuming from checkpoint step-(\d+)\.pt: step (\d+) of \d+, epoch (\d+), "
                      r"batch (\d+)", res.stderr)
    assert found, res.stderr[-3000:]
    resumed_step, epoch, batch_pos = int(found.group(2)), int(found.group(3)), int(found.group(4))
    assert resumed_step > 0 and batch_pos > 0 and epoch >= 2  # mid-epoch, not from scratch
    assert resumed_step == epoch * per_epoch + batch_pos

    a, b = metrics(ref), metrics(out)
    assert b["resumed_from_steps"] == [resumed_step] and a["resumed_from_steps"] == []
    assert b["steps"] == a["steps"] == epochs * per_epoch
    assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=0.03)
    assert b["test_macro_f1"] == pytest.approx(a["test_macro_f1"], abs=0.03)
    ha, hb = history(ref), history(out)
    assert [h["step"] for h in hb] == [h["step"] for h in ha]  # no gap, no duplicate
    for x, y in zip(ha, hb, strict=True):
        assert y["lr"] == pytest.approx(x["lr"], rel=1e-9)
        assert y["loss"] == pytest.approx(x["loss"], abs=0.02)


@pytest.mark.e2e
def test_early_stopping_all_ranks_stop_together_bf16(tmp_path: Path, env: dict[str, str]) -> None:
    """A learning rate too small to change any prediction: validation macro-F1 stays put, so
    patience 1 stops the run after the second evaluation, on both ranks at the same step."""
    curated, labels = make_curated(tmp_path / "data", n_train=40)
    cfg = write_config(tmp_path / "cfg.json", epochs=6, batch_size=16, lr=1e-9, precision="bf16",
                       early_stopping_patience=1, checkpoint_every_steps=100)
    out = tmp_path / "out"
    res = run(train_cmd(curated, labels, out, cfg), env)
    assert res.returncode == 0, res.stderr[-4000:]
    m = metrics(out)
    assert m["stop_reason"].startswith("early stopping")
    assert m["epochs_completed"] == 2 and m["best_epoch"] == 0
    assert m["steps"] == 2 * m["steps_per_epoch"] < m["total_steps_planned"]
    assert m["precision"] == "bf16" and len(m["val_history"]) == 2


# --------------------------------------------------------------------------- checkpoints


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("disk full (simulated by an object that cannot be serialized)")


def test_auto_precision_is_bf16_only_where_the_hardware_computes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Emulated bf16 is slower than fp32 (5x to 15x on a CPU without AVX512-BF16), so
    ``auto`` asks the hardware; an explicit choice is used as asked."""
    from training.optim import native_bf16, resolve_precision

    cpu = torch.device("cpu")
    for avx512_bf16, amx, expected in [(False, False, "fp32"), (True, False, "bf16"),
                                       (False, True, "bf16")]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert native_bf16(cpu) is (expected == "bf16")
        assert resolve_precision("auto", cpu) == expected
        assert resolve_precision("fp32", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(pydantic.ValidationError):
        TrainConfig.model_validate({"precision": "fp16"})


def test_atomic_save_leaves_no_partial_file(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    cfg = {"training": {"lr": 0.001}}
    state = {"global_step": 5, "config": cfg, "config_fingerprint": ckpt.config_fingerprint(cfg),
             "model": {"w": torch.arange(10.0)}}
    good = ckpt.save(folder, state)
    # The failing write streams megabytes of tensor data before it dies.
    bad = state | {"global_step": 6, "model": {"w": torch.zeros(1_000_000)}, "x": _Unpicklable()}
    with pytest.raises(RuntimeError, match="cannot be serialized"):
        ckpt.save(folder, bad)
    assert sorted(p.name for p in folder.iterdir()) == [good.name]
    assert ckpt.latest(folder) == good
    assert torch.equal(ckpt.load(good, cfg)["model"]["w"], torch.arange(10.0))

    # A truncated file under a checkpoint name (e.g. copied by hand) is passed over.
    (folder / "step-00000009.pt").write_bytes(good.read_bytes()[:200])
    assert not ckpt.is_complete(folder / "step-00000009.pt")
    assert ckpt.latest(folder) == good
    # A temp file of a write interrupted by SIGKILL is never picked and is cleaned up.
    (folder / ".tmp-step-00000010.pt.abc").write_bytes(b"partial")
    assert ckpt.latest(folder) == good
    assert ckpt.remove_stale_temps(folder) == 1


def test_checkpoint_keeps_last_two_and_restores_rng(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    cfg = {"a": 1}
    torch.manual_seed(3)
    rng = ckpt.capture_rng()
    expected = torch.rand(3)
    for step in (1, 2, 3, 4):
        ckpt.save(folder, {"global_step": step, "config": cfg, "rng": [rng],
                           "config_fingerprint": ckpt.config_fingerprint(cfg)})
    ckpt.save_best(folder, {"w": torch.ones(2)}, {"config": cfg,
                                                  "config_fingerprint": ckpt.config_fingerprint(cfg)})
    assert sorted(p.name for p in folder.iterdir()) == ["best.pt", "step-00000003.pt",
                                                        "step-00000004.pt"]
    data = ckpt.load(ckpt.latest(folder), cfg)
    torch.manual_seed(99)
    ckpt.restore_rng(data["rng"][0])
    assert torch.equal(torch.rand(3), expected)


def test_config_mismatch_names_the_differing_keys(tmp_path: Path) -> None:
    stored = {"training": TrainConfig(**SMALL).model_dump(), "world_size": 2}
    path = ckpt.save(tmp_path, {"global_step": 3, "config": stored,
                                "config_fingerprint": ckpt.config_fingerprint(stored)})
    current = {"training": TrainConfig(**(SMALL | {"lr": 5e-4})).model_dump(), "world_size": 1}
    with pytest.raises(ckpt.ConfigMismatchError) as err:
        ckpt.load(path, current)
    assert err.value.differing == ["training.lr", "world_size"]
    assert "training.lr (checkpoint 0.001, now 0.0005)" in str(err.value)
    # Key order does not count as a difference.
    assert ckpt.load(path, dict(reversed(list(stored.items()))))["global_step"] == 3


# --------------------------------------------------------------------------- bad input


def _frame(labels: list[str], split: str = "train") -> pd.DataFrame:
    return pd.DataFrame({"record_id": [f"r{i}" for i in range(len(labels))],
                         "text": [f"message {i}" for i in range(len(labels))],
                         "label": labels, "weight": 1.0, "split": split})


def _bad_curated(root: Path, frame: pd.DataFrame) -> tuple[Path, Path]:
    (root / "curated").mkdir(parents=True)
    frame.to_parquet(root / "curated" / "part-0.parquet", index=False)
    (root / "labels.json").write_text(json.dumps(CLASSES))
    return root / "curated", root / "labels.json"


@pytest.mark.parametrize(("train_labels", "message"), [
    ([], "the train split is empty"),
    (["card_arrival"] * 12, "the train split has a single class ('card_arrival', 12 rows)"),
])
def test_bad_train_split_fails_clearly(tmp_path: Path, env: dict[str, str],
                                       train_labels: list[str], message: str) -> None:
    frame = pd.concat([_frame(train_labels), _frame(["card_arrival", "age_limit"], "val"),
                       _frame(["card_arrival", "age_limit"], "test")], ignore_index=True)
    curated, labels = _bad_curated(tmp_path, frame)
    with pytest.raises(TrainingDataError, match=re.escape(message)):
        check_train_split(load_curated(curated, load_labels(labels))["train"], curated)
    cfg = write_config(tmp_path / "cfg.json", epochs=1, batch_size=4)
    res = run(train_cmd(curated, labels, tmp_path / "out", cfg, nproc=1), env, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert message in res.stderr
    assert not (tmp_path / "out" / "done").exists()


def test_unknown_label_and_config_key_are_rejected(tmp_path: Path) -> None:
    curated, labels = _bad_curated(tmp_path, _frame(["card_arrival", "Lost Card", "age_limit"]))
    with pytest.raises(TrainingDataError, match=r"1 row\(s\) carry 1 label\(s\) not in the class list: \['Lost Card'\]"):
        load_curated(curated, load_labels(labels))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(SMALL | {"grad_acum_steps": 2}))
    with pytest.raises(TrainingDataError, match="grad_acum_steps: Extra inputs are not permitted"):
        load_config(bad)


def test_labels_are_canonicalized_like_the_clean_stage(tmp_path: Path) -> None:
    path = tmp_path / "l.json"
    path.write_text(json.dumps(["Refund_not_showing_up", "card-arrival", " Card Arrival ", "age_limit"]))
    assert load_labels(path) == ["age_limit", "card_arrival", "refund_not_showing_up"]


def test_dynamic_padding_and_truncation() -> None:
    tok = load_tokenizer(max_length=8)
    frame = _frame(["a", "b"]).assign(text=["hi", "my card has not arrived yet, it has been weeks"])
    ds = EncodedDataset(frame, ["a", "b"], tok)
    batch = PadCollate(pad_token_id(tok))([ds[0], ds[1]])
    assert batch.input_ids.shape == (2, 8)  # longest row, truncated to max_length
    assert batch.attention_mask.sum(dim=1).tolist() == [3, 8]  # [CLS] hi [SEP]
    assert PadCollate(0)([ds[0]]).input_ids.shape == (1, 3)  # no padding to max_length


def test_length_grouping_keeps_every_row_once_and_cuts_padding() -> None:
    rng = random.Random(3)
    lengths = [rng.randint(3, 60) for _ in range(1003)]
    order = list(range(1003))
    rng.shuffle(order)
    grouped = group_by_length(order, lengths, batch_size=16, group=10, seed=5)
    assert sorted(grouped) == list(range(1003))  # a permutation: nothing lost, nothing twice
    assert grouped == group_by_length(order, lengths, 16, 10, seed=5)  # a resume sees the same
    assert grouped != group_by_length(order, lengths, 16, 10, seed=6)  # epochs differ

    def padded(o: list[int]) -> int:
        return sum(len(o[k:k + 16]) * max(lengths[i] for i in o[k:k + 16]) for k in range(0, len(o), 16))

    assert padded(grouped) < 0.7 * padded(order)
    # the one partial batch (the longest 11 of the last 43-row chunk) stays last, so a
    # resume skips whole batches
    assert grouped[-11:] == sorted(order[960:], key=lambda i: lengths[i])[32:]
    assert group_by_length(order, lengths, 16, 0, seed=5) == order  # 0 switches it off


# --------------------------------------------------------------------------- MiniLM


def test_minilm_loads_offline_and_gives_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from training.models import build_from_spec, build_model

    tok = load_tokenizer(64)
    torch.manual_seed(0)
    model, spec = build_model("minilm", len(CLASSES), 64, tok.get_vocab_size(), pad_token_id(tok),
                              dropout=0.1)
    assert spec["hidden_size"] == 384 and spec["num_layers"] == 6
    ds = EncodedDataset(_frame(["a", "b"]).assign(text=["card not arrived", "<PERSON> lost <CARD>"]),
                        ["a", "b"], tok)
    batch = PadCollate(pad_token_id(tok))([ds[0], ds[1]])
    model.eval()
    with torch.no_grad():
        logits = model(batch.input_ids, batch.attention_mask)
        assert logits.shape == (2, len(CLASSES)) and torch.isfinite(logits).all()
        # Rebuilt from the stored spec alone (no package weights) it computes the same.
        again = build_from_spec(spec)
        again.load_state_dict(model.state_dict())
        assert torch.allclose(again.eval()(batch.input_ids, batch.attention_mask), logits, atol=1e-5)
        # Mean pooling over the mask: extra padding does not change the logits.
        wide = torch.nn.functional.pad(batch.input_ids, (0, 5), value=pad_token_id(tok))
        mask = torch.nn.functional.pad(batch.attention_mask, (0, 5))
        assert torch.allclose(model(wide, mask), logits, atol=1e-4)


# --------------------------------------------------------------------------- MLflow


def test_mlflow_logging_into_given_run(tmp_path: Path, env: dict[str, str],
                                       mlflow_server: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.create_experiment(f"training-test-{time.time_ns()}")
    run_id = client.create_run(exp).info.run_id
    curated, labels = make_curated(tmp_path / "data", n_train=40)
    cfg = write_config(tmp_path / "cfg.json", epochs=2, batch_size=16, checkpoint_every_steps=4)
    out = tmp_path / "out"
    res = run([*train_cmd(curated, labels, out, cfg, nproc=1), "--mlflow-run-id", run_id],
              env | {"MLFLOW_TRACKING_URI": mlflow_server})
    assert res.returncode == 0, res.stderr[-4000:]
    m = metrics(out)
    data = client.get_run(run_id).data
    assert data.params["model"] == "small" and data.params["batch_size"] == "16"
    assert data.params["world_size"] == "1"
    losses = client.get_metric_history(run_id, "train_loss")
    assert sorted(x.step for x in losses) == list(range(1, m["steps"] + 1))
    assert len(client.get_metric_history(run_id, "val_macro_f1")) == 2
    assert data.metrics["test_accuracy"] == pytest.approx(m["test_accuracy"])
    assert data.metrics["test_macro_f1"] == pytest.approx(m["test_macro_f1"])
    arts = {a.path for a in client.list_artifacts(run_id, "training")}
    assert arts == {"training/config.json", "training/metrics.json",
                    "training/classification_report.json", "training/confusion_matrix.png"}
    assert not any(a.path.startswith("model") for a in client.list_artifacts(run_id))


def test_unreachable_tracking_server_fails_naming_the_uri(tmp_path: Path,
                                                          env: dict[str, str]) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    curated, labels = make_curated(tmp_path / "data", n_train=20)
    cfg = write_config(tmp_path / "cfg.json", epochs=1, batch_size=16)
    res = run([*train_cmd(curated, labels, tmp_path / "out", cfg, nproc=1), "--mlflow-run-id",
               "0" * 32], env | {"MLFLOW_TRACKING_URI": uri}, timeout=180)
    assert res.returncode == 2
    assert f"MLflow tracking server {uri}" in res.stderr and "attempt 5/5" in res.stderr
    assert res.stderr.count("retrying in") == 4


# --------------------------------------------------------------------------- sharing (issue 29)


@pytest.mark.e2e
def test_compression_hooks_train_to_the_same_accuracy_with_fewer_bytes(
        tmp_path: Path, env: dict[str, str]) -> None:
    """fp16 and PowerSGD communication hooks on 2 gloo processes: the tiny model reaches the
    accuracy of the uncompressed run within a tolerance, and the measured all-reduce payload
    shrinks: exactly half with fp16, far less than that with PowerSGD once it starts."""
    curated, labels = make_curated(tmp_path / "data", n_train=60)
    base = {"epochs": 4, "batch_size": 8, "lr": 2e-3, "num_threads": 1}
    result = {}
    for hook in ("none", "fp16", "powersgd"):
        cfg = write_config(tmp_path / f"{hook}.json", **base, comm_hook=hook, powersgd_rank=2,
                           powersgd_start_iter=3)
        out = tmp_path / hook
        res = run(train_cmd(curated, labels, out, cfg), env)
        assert res.returncode == 0, res.stderr[-4000:]
        result[hook] = (metrics(out), history(out))
    none, fp16, psgd = (result[h][0] for h in ("none", "fp16", "powersgd"))
    assert none["comm_hook"] == "none" and fp16["comm_hook"] == "fp16"
    assert none["test_accuracy"] >= 0.6, none["test_accuracy"]
    for m in (fp16, psgd):
        assert m["test_accuracy"] == pytest.approx(none["test_accuracy"], abs=0.1)
        assert m["steps"] == none["steps"]
    per_step = [h["comm_bytes"] for h in result["none"][1]]
    assert len(set(per_step)) == 1 and per_step[0] > 0  # every step reduces all gradients
    assert fp16["comm_bytes"] * 2 == none["comm_bytes"]
    psgd_steps = [h["comm_bytes"] for h in result["powersgd"][1]]
    assert psgd_steps[:2] == per_step[:2]  # PowerSGD's warm-up: plain fp32 all-reduces
    assert max(psgd_steps[3:]) < per_step[0] / 4


def test_bf16_hook_is_refused_on_gloo(tmp_path: Path, env: dict[str, str]) -> None:
    curated, labels = make_curated(tmp_path / "data", n_train=20)
    cfg = write_config(tmp_path / "cfg.json", epochs=1, batch_size=16, comm_hook="bf16")
    res = run(train_cmd(curated, labels, tmp_path / "out", cfg), env, timeout=180)
    assert res.returncode != 0
    assert "comm_hook=bf16 needs the nccl backend" in res.stderr
    assert not (tmp_path / "out" / "done").exists()


def _state_dict(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model" / "model.pt", weights_only=True)


def _assert_same_model(a: Path, b: Path) -> None:
    sa, sb = _state_dict(a), _state_dict(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.e2e
def test_prefetch_workers_give_the_identical_run(tmp_path: Path, env: dict[str, str]) -> None:
    """DataLoader workers (persistent, prefetching) only move batch building off the training
    process: the loss of every step and the final weights are bit-identical to a run
    without them, and the checkpoint identity ignores the setting."""
    curated, labels = make_curated(tmp_path / "data", n_train=40)
    base = {"epochs": 2, "batch_size": 8, "num_threads": 1, "checkpoint_every_steps": 5}
    plain = write_config(tmp_path / "plain.json", **base)
    workers = write_config(tmp_path / "workers.json", **base, num_workers=2, prefetch_factor=3,
                           persistent_workers=True)
    outs = {}
    for name, cfg in (("plain", plain), ("workers", workers)):
        outs[name] = tmp_path / name
        res = run(train_cmd(curated, labels, outs[name], cfg, nproc=1), env)
        assert res.returncode == 0, res.stderr[-4000:]
    ha, hb = history(outs["plain"]), history(outs["workers"])
    assert len(ha) == metrics(outs["plain"])["steps"] > 5
    assert [h["loss"] for h in ha] == [h["loss"] for h in hb]
    _assert_same_model(outs["plain"], outs["workers"])
    assert metrics(outs["plain"])["config_fingerprint"] == metrics(outs["workers"])["config_fingerprint"]


def test_persistent_workers_need_workers() -> None:
    with pytest.raises(ValueError, match="persistent_workers needs num_workers > 0"):
        TrainConfig(**SMALL, persistent_workers=True)


def _kill_at_mid_epoch_checkpoint(cmd: list[str], env: dict[str, str], out: Path, log_path: Path,
                                  per_epoch: int, sig: int = signal.SIGKILL) -> subprocess.Popen:
    """Start ``cmd``; once a checkpoint past the first epoch and inside an epoch exists, send
    ``sig`` to the launcher's process group; return the finished process."""
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "no mid-epoch checkpoint appeared"
            steps = [s for s, _ in ckpt.step_checkpoints(out / "checkpoints")]
            if any(s > per_epoch and s % per_epoch for s in steps):
                break
            time.sleep(0.02)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    return proc


def _traced(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """pid -> the trace lines that process wrote."""
    return {int(p.stem.split("-")[1]): [json.loads(x) for x in p.read_text().splitlines()]
            for p in folder.glob("rank*-*.jsonl")}


@pytest.mark.e2e
@pytest.mark.parametrize(("first_world", "then_world", "accum"), [(2, 1, 1), (1, 2, 2)])
def test_resume_at_another_world_size_sees_every_sample_once(
        tmp_path: Path, env: dict[str, str], first_world: int, then_world: int, accum: int) -> None:
    """A run killed mid-epoch at one world size resumes at another: the global batch is kept
    (grad_accum_steps rescaled), and each epoch's consumed train rows, recorded per rank and
    optimizer step, are every row exactly once across both attempts."""
    n_rows, batch, epochs = 40 * len(CLASSES), 8, 3
    curated, labels = make_curated(tmp_path / "data", n_train=40)
    cfg = write_config(tmp_path / "cfg.json", epochs=epochs, batch_size=batch, grad_accum_steps=accum,
                       checkpoint_every_steps=3, num_threads=1)
    micro = math.ceil(math.ceil(n_rows / first_world) / batch)
    per_epoch = math.ceil(micro / accum)
    out, trace = tmp_path / "out", tmp_path / "trace"
    trace.mkdir()
    tenv = env | {"INTENTOPS_TRAIN_TRACE_IDS": str(trace)}
    proc = _kill_at_mid_epoch_checkpoint(train_cmd(curated, labels, out, cfg, nproc=first_world),
                                         tenv, out, tmp_path / "first.log", per_epoch)
    assert proc.returncode != 0 and not (out / "done").exists()
    first_pids = set(_traced(trace))
    res = run(train_cmd(curated, labels, out, cfg, nproc=then_world), tenv)
    assert res.returncode == 0, res.stderr[-4000:]
    found = re.search(r"resuming from checkpoint step-\d+\.pt: step (\d+) of", res.stderr)
    assert found and "resized: epoch" in res.stderr, res.stderr[-3000:]
    resumed = int(found.group(1))
    assert 0 < resumed < epochs * per_epoch and resumed % per_epoch

    lines = []
    for pid, rows in _traced(trace).items():
        # the killed attempt's steps after its last checkpoint were redone by the resume
        lines += [r for r in rows if pid not in first_pids or r["step"] <= resumed]
    for epoch in range(epochs):
        ids = sorted(i for r in lines if r["epoch"] == epoch for i in r["ids"])
        assert ids == list(range(n_rows)), f"epoch {epoch}"
    m = metrics(out)
    assert m["world_size"] == then_world and m["resumed_from_steps"] == [resumed]
    assert m["epochs_completed"] == epochs
    assert m["test_accuracy"] >= 0.5, m["test_accuracy"]  # chance is 0.2
    steps = [h["step"] for h in history(out)]
    assert steps == list(range(1, m["steps"] + 1))


def test_resize_that_cannot_keep_the_global_batch_is_refused() -> None:
    from training.state import resized_accum

    cfg = TrainConfig(**SMALL, grad_accum_steps=1)
    assert resized_accum(cfg, 2, 1) == 2 and resized_accum(cfg, 1, 1) == 1
    assert resized_accum(TrainConfig(**SMALL, grad_accum_steps=2), 1, 2) == 1
    with pytest.raises(ckpt.CheckpointError, match="cannot resume at world size 2: the run started "
                       "at world size 1 with grad_accum_steps 1"):
        resized_accum(cfg, 1, 2)


def _history_steps(out: Path) -> int:
    try:
        return len((out / "history.jsonl").read_text().splitlines())
    except OSError:
        return 0


@pytest.mark.e2e
@pytest.mark.parametrize("hook", ["none", "powersgd"])
def test_sigterm_preempts_with_a_checkpoint_and_the_resume_is_identical(
        tmp_path: Path, env: dict[str, str], hook: str) -> None:
    """A SIGTERM to the torchrun launcher (what the preemption controller sends) mid-epoch:
    every rank finishes its step, rank 0 checkpoints and writes the preempted marker, the
    workers exit 75; the next launch resumes there and ends with the very state_dict of an
    uninterrupted run at the same world size. With PowerSGD too: each rank's error feedback,
    factors, iteration and generator are in the checkpoint (without them the resumed run
    restarts PowerSGD's warm-up and the weights differ)."""
    curated, labels = make_curated(tmp_path / "data", n_train=60)
    cfg = write_config(tmp_path / "cfg.json", epochs=3, batch_size=8, num_threads=1,
                       checkpoint_every_steps=1000, comm_hook=hook, powersgd_rank=2, powersgd_start_iter=3)
    per_epoch = math.ceil(math.ceil(60 * len(CLASSES) / 2) / 8)
    ref = tmp_path / "uninterrupted"
    res = run(train_cmd(curated, labels, ref, cfg), env)
    assert res.returncode == 0, res.stderr[-4000:]

    out = tmp_path / "preempted"
    cmd = train_cmd(curated, labels, out, cfg)
    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while _history_steps(out) < per_epoch + 3:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)  # the launcher only; it forwards it to the workers
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text()
    assert proc.returncode != 0, text[-3000:]
    marker = json.loads((out / "preempted").read_text())
    assert not (out / "done").exists()
    step = marker["step"]
    assert per_epoch < step < 3 * per_epoch and step % per_epoch, marker
    assert marker["signal_to_exit_seconds"] is not None
    assert [s for s, _ in ckpt.step_checkpoints(out / "checkpoints")][-1] == step
    # (torchrun itself exits on the signal: the marker, not its exit code, tells preemption)
    assert "preempted: checkpoint at step" in text

    res = run(cmd, env)
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"resuming from checkpoint step-{step:08d}.pt" in res.stderr
    assert not (out / "preempted").exists()
    assert metrics(out)["resumed_from_steps"] == [step]
    assert metrics(out)["steps"] == metrics(ref)["steps"]
    _assert_same_model(ref, out)


@pytest.mark.e2e
def test_a_tiny_search_picks_the_better_setting(tmp_path: Path, env: dict[str, str],
                                                mlflow_server: str) -> None:
    """Two learning rates, one that cannot learn anything in two epochs: the study (real
    training runs as trials, each a nested MLflow run the trainer logs into) picks the
    other, and records every trial."""
    from mlflow import MlflowClient

    from core.config import SearchConfig, load_config
    from training.search import run_study
    from training.task import _NestedRuns

    client = MlflowClient(tracking_uri=mlflow_server)
    parent = client.create_run(client.create_experiment(f"search-{time.time_ns()}")).info.run_id
    cfg = load_config(overrides={"tracking.uri": mlflow_server}, env={})
    curated, labels = make_curated(tmp_path / "data", n_train=40)
    search = SearchConfig(enabled=True, trials=2, trial_epochs=2, lr=[1e-9, 3e-3], seed=1)
    base = TrainConfig(**SMALL, num_threads=1)

    def launch(out: Path, config: Path, run_id: str | None) -> list[str]:
        return [*train_cmd(curated, labels, out, config, nproc=1), "--mlflow-run-id", str(run_id)]

    tenv = env | {"MLFLOW_TRACKING_URI": mlflow_server}
    summary = run_study(search, base, launch, tmp_path / "search", tenv, ROOT, _NestedRuns(cfg, parent))
    children = client.search_runs([client.get_run(parent).info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(float(c.data.params["lr"]) for c in children) == [1e-9, 3e-3]
    assert all(c.info.status == "FINISHED" and "best_val_macro_f1" in c.data.metrics
               and len(client.get_metric_history(c.info.run_id, "train_loss")) > 0 for c in children)
    assert summary["best_params"] == {"lr": 3e-3}
    assert summary["sampler"] == "GridSampler"
    states = {t["params"]["lr"]: (t["state"], t["value"]) for t in summary["trials"]}
    assert set(states) == {1e-9, 3e-3} and all(s == "COMPLETE" for s, _ in states.values())
    assert states[3e-3][1] > states[1e-9][1]
    assert json.loads((tmp_path / "search" / "search.json").read_text()) == summary
    # Within the budget already spent, a second call runs no new trial (the study persists).
    assert run_study(search, base, launch, tmp_path / "search", env, ROOT)["trials"] == summary["trials"]


@pytest.mark.e2e
def test_elastic_run_survives_losing_the_node_without_the_store(tmp_path: Path,
                                                                env: dict[str, str]) -> None:
    """Two launchers (`--nnodes 1:2`, c10d rendezvous on this host, one process each): the
    one that does not host the rendezvous store is SIGKILLed mid-epoch; the other restarts
    its worker, re-rendezvouses alone and finishes from the last checkpoint at world size 1,
    with every train row of every epoch consumed exactly once."""
    from conftest import _free_port

    n_rows, batch, epochs = 40 * len(CLASSES), 8, 3
    curated, labels = make_curated(tmp_path / "data", n_train=40)
    cfg = write_config(tmp_path / "cfg.json", epochs=epochs, batch_size=batch,
                       checkpoint_every_steps=3, num_threads=1)
    out, trace = tmp_path / "out", tmp_path / "trace"
    trace.mkdir()
    port = _free_port()

    def launcher(host: bool) -> list[str]:
        return [str(BIN / "torchrun"), "--nnodes", "1:2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", "elastic-test", "--rdzv-conf", f"is_host={int(host)}",
                "--max-restarts", "3", "--monitor-interval", "1",
                "-m", "training.train", "--curated", str(curated), "--labels", str(labels),
                "--out", str(out), "--config", str(cfg)]

    tenv = env | {"INTENTOPS_TRAIN_TRACE_IDS": str(trace)}
    logs = [(tmp_path / f"launcher-{i}.log").open("w") for i in range(2)]
    host = subprocess.Popen(launcher(True), env=tenv, cwd=ROOT, stdout=logs[0],
                            stderr=subprocess.STDOUT, start_new_session=True)
    other = subprocess.Popen(launcher(False), env=tenv, cwd=ROOT, stdout=logs[1],
                             stderr=subprocess.STDOUT, start_new_session=True)
    per_epoch = math.ceil(math.ceil(n_rows / 2) / batch)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert host.poll() is None and other.poll() is None, \
                (tmp_path / "launcher-0.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no mid-epoch checkpoint appeared"
            steps = [s for s, _ in ckpt.step_checkpoints(out / "checkpoints")]
            if any(s > per_epoch and s % per_epoch for s in steps):
                break
            time.sleep(0.05)
        first_pids = set(_traced(trace))
        assert len(first_pids) == 2, "the first round did not run at world size 2"
        os.killpg(other.pid, signal.SIGKILL)  # the node without the rendezvous store is lost
        other.wait(timeout=30)
        assert host.wait(timeout=600) == 0, (tmp_path / "launcher-0.log").read_text()[-4000:]
    finally:
        for p in (host, other):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in logs:
            f.close()
    m = metrics(out)
    assert (out / "done").exists() and m["world_size"] == 1 and m["epochs_completed"] == epochs
    resumed = m["resumed_from_steps"][-1]
    lines = []
    for pid, rows in _traced(trace).items():
        lines += [r for r in rows if pid not in first_pids or r["step"] <= resumed]
    for epoch in range(epochs):
        ids = sorted(i for r in lines if r["epoch"] == epoch for i in r["ids"])
        assert ids == list(range(n_rows)), f"epoch {epoch}"


@pytest.mark.e2e
def test_the_train_task_launch_is_preempted_by_the_controller(tmp_path: Path,
                                                              env: dict[str, str]) -> None:
    """The train task's launch under a lease, a real torchrun group, preempted by the
    controller's own ``preempt`` on that lease: the launch raises StagePreempted (what the
    DAG turns into a reschedule), and launching again finishes from the checkpoint."""
    import threading

    from core.stage import StagePreempted
    from training.preempt import preempt, read_leases
    from training.task import launch_preemptible

    curated, labels = make_curated(tmp_path / "data", n_train=40)
    cfg = write_config(tmp_path / "cfg.json", epochs=4, batch_size=8, num_threads=1,
                       checkpoint_every_steps=1000)
    lake, work = tmp_path / "lake", tmp_path / "work"
    cmd = train_cmd(curated, labels, work, cfg)
    outcome: list[BaseException | str] = []

    def task() -> None:
        try:
            outcome.append(launch_preemptible(cmd, env, lake, "manual__experiment", 1, work))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    t = threading.Thread(target=task)
    t.start()
    deadline = time.monotonic() + 240
    while _history_steps(work) < 5:
        assert t.is_alive() and time.monotonic() < deadline, outcome
        time.sleep(0.05)
    (lease,) = read_leases(lake)
    assert lease.run_id == "manual__experiment" and lease.priority == 1
    freed = preempt(lease, grace_seconds=60)
    t.join(timeout=120)
    assert freed["checkpointed"] and not freed["killed"]
    assert len(outcome) == 1 and isinstance(outcome[0], StagePreempted), outcome
    assert "preempted at step" in str(outcome[0]) and read_leases(lake) == []
    launch_preemptible(cmd, env, lake, "manual__experiment", 1, work)
    assert (work / "done").exists() and metrics(work)["resumed_from_steps"]


@pytest.mark.e2e
@pytest.mark.parametrize("killed", ["task", "supervisor"])
def test_a_killed_train_task_takes_its_launcher_along_with_a_checkpoint(tmp_path: Path, env: dict[str, str],
                                                                        killed: str) -> None:
    """``task``: the task process that runs the launcher is SIGKILLed (an OOM kill): the
    launcher, in its own session, is told by the kernel (parent-death signal).
    ``supervisor``: the task's parent dies instead (Airflow's supervisor, killed with its
    Celery worker, while the task runs in a process group of its own and lives on): the
    orphaned task notices and stops its launcher. Either way the group checkpoints and
    exits as on a preemption, instead of training on beside the retry in the same work
    folder, and the retry resumes from that checkpoint."""
    import psutil

    curated, labels = make_curated(tmp_path / "data", n_train=40)
    cfg = write_config(tmp_path / "cfg.json", epochs=4, batch_size=8, num_threads=1,
                       checkpoint_every_steps=1000)
    lake, work = tmp_path / "lake", tmp_path / "work"
    cmd = train_cmd(curated, labels, work, cfg)
    task_code = ("import json, os, sys; from pathlib import Path; from training.task import launch_preemptible; "
                 "launch_preemptible(json.loads(sys.argv[1]), dict(os.environ), Path(sys.argv[2]), "
                 "'manual__killed', 1, Path(sys.argv[3]))")
    task_cmd = [sys.executable, "-c", task_code, json.dumps(cmd), str(lake), str(work)]
    if killed == "supervisor":  # a parent that starts the task in a process group of its own
        sup_code = ("import os, subprocess, sys, time; p = subprocess.Popen(sys.argv[1:], process_group=0); "
                    "p.wait()")
        top = subprocess.Popen([sys.executable, "-c", sup_code, *task_cmd], env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        top = subprocess.Popen(task_cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 240
        while _history_steps(work) < 5:
            assert top.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        tree = psutil.Process(top.pid).children(recursive=True)
        launcher = next(p for p in tree if "torchrun" in " ".join(p.cmdline()))
        task = psutil.Process(top.pid) if killed == "task" else launcher.parent()
        top.kill()
        top.wait(timeout=30)
        assert psutil.wait_procs([launcher, task], timeout=180)[1] == [], "the launcher outlived its task"
    finally:  # only what this test started (the session's Spark JVM and servers are ours too)
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(top.pid), *psutil.Process(top.pid).children(recursive=True)]
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()
    assert (work / "preempted").exists(), "the group did not checkpoint on the way out"
    assert not any("training.train" in " ".join(p.info["cmdline"] or [])
                   and str(work) in " ".join(p.info["cmdline"] or [])
                   for p in psutil.process_iter(["cmdline"]))
    from training.task import launch_preemptible

    launch_preemptible(cmd, env, lake, "manual__killed", 1, work)
    assert (work / "done").exists() and metrics(work)["resumed_from_steps"]
