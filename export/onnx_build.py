"""ONNX export, fp32 parity, int8 quantization chosen by measurement, and the speed report.

* **Export.** ``torch.onnx.export`` with dynamic batch and sequence axes from example
  inputs of size 2 x 8 (so the tracer cannot specialize a dimension of size 1), an
  explicit opset, then a check that the graph really is dynamic: the axes are symbolic in
  the graph and the session runs at several batch sizes and sequence lengths.
  For MiniLM the TorchScript exporter (``dynamo=False``) is used on purpose, with its's attention
  switched to the eager implementation: ONNX Runtime's transformer optimizer recognizes
  that graph (6 Attention and 1 EmbedLayerNormalization fusions; SkipLayerNormalization
  is left out, slower on CPU, see ``export.runtime.DISABLED_OPTIMIZERS``),
  while the dynamo exporter's graph of the same model got no attention or embedding
  fusion, and its int8 build was 1.2-1.5x slower at batch 32 (measured on this machine,
  docs/BENCHMARKS.md).
* **Parity.** PyTorch and ONNX Runtime get the same ids and mask for every row of the test
  split; the largest absolute logit difference and the argmax agreement are checked.
* **int8.** ``quant_pre_process`` then ``quantize_dynamic`` (int8 weights, dynamic uint8
  activations) for each candidate: transformer fusions none / full / all but attention,
  per-channel on/off, reduce-range on/off. Each candidate is timed on this machine and
  checked for accuracy; the fastest at batch 32 that passes the gate ships.
* **Report.** Size; batch-1 latency p50/p99 and batch-32 throughput of PyTorch eager,
  ONNX Runtime fp32 (unfused) and the shipped int8 build, measured interleaved in one run
  so machine noise hits all three alike; accuracy of each; threads and hardware.
"""

from __future__ import annotations

import contextlib
import json
import logging
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.stage import StageVerdict
from export.runtime import MODEL_FILE, TextEncoder, default_threads, session

log = logging.getLogger(__name__)

# contract.json: the text preprocessing and reject rule (training.contract) every build carries.
REQUIRED_MODEL_FILES = ("model.pt", "model_config.json", "tokenizer.json", "labels.json", "contract.json")
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "logits"
# Which exporter per model kind. MiniLM: the TorchScript exporter, whose graph ORT's
# transformer optimizer fuses (see the module docstring). The small encoder:
# torch.export (dynamo), because the TorchScript trace of nn.MultiheadAttention bakes
# batch x heads into a Reshape, a graph that claims dynamic axes but fails at any other
# batch size (check_dynamic caught it).
EXPORTERS = {"minilm": "torchscript", "small": "dynamo"}
# Shapes the dynamic-axes check runs (the issue's: batch 1, 3, 17 x sequence 5, 64).
CHECK_BATCHES = (1, 3, 17)
CHECK_SEQUENCES = (5, 64)


class ExportError(StageVerdict):
    """The export or one of its checks failed (fp32 parity, an unsupported opset): a property
    of the model or the settings, not a transient error; the message says which and why."""


# ---------------------------------------------------------------------------- export


def check_model_dir(model_dir: str | Path) -> Path:
    model_dir = Path(model_dir)
    missing = [f for f in REQUIRED_MODEL_FILES if not (model_dir / f).is_file()]
    if missing:
        raise ExportError(f"model folder {model_dir} lacks {', '.join(missing)}: an export needs "
                          f"what training writes ({', '.join(REQUIRED_MODEL_FILES)})")
    return model_dir


def runtime_supports_opset(opset: int) -> tuple[bool, str]:
    """Whether the installed onnxruntime loads a model of this opset (probed with a
    one-node model: onnxruntime publishes no API for its highest opset)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    ops = [helper.make_opsetid("", opset)]
    try:
        ir = helper.find_min_ir_version_for(ops)
    except Exception:  # onnx itself does not know the opset
        return False, f"onnx {onnx.__version__} knows opsets up to {onnx.defs.onnx_opset_version()}"
    model = helper.make_model(graph, opset_imports=ops, ir_version=ir)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        return False, str(exc).splitlines()[0][:300]
    return True, ""


def check_opset(opset: int) -> None:
    from torch.onnx import _constants

    lo, hi = _constants.ONNX_MIN_OPSET, _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    if not lo <= opset <= hi:
        raise ExportError(f"opset {opset} is outside what the installed torch exports ({lo}..{hi})")
    ok, why = runtime_supports_opset(opset)
    if not ok:
        import onnxruntime as ort

        raise ExportError(f"opset {opset} is not supported by the installed onnxruntime "
                          f"{ort.__version__}: {why}")


def load_for_export(model_dir: Path):
    from training.models import load_trained

    model, spec = load_trained(model_dir)
    if spec["kind"] == "minilm":
        # Eager attention exports the MatMul/Softmax pattern ORT's optimizer fuses (see the
        # module docstring); numerically it is the same attention as SDPA (parity checks it).
        model.encoder.set_attn_implementation("eager")
    return model.eval(), spec


def export_fp32(model_dir: str | Path, out_dir: str | Path, opset: int, dynamic: bool = True) -> Path:
    """Export the trained model to ``out_dir`` as a build folder; returns the folder.

    ``dynamic=False`` exports fixed shapes; it exists so tests can prove the check below
    rejects such a graph."""
    import torch

    model_dir = check_model_dir(model_dir)
    check_opset(opset)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, spec = load_for_export(model_dir)
    pad_id = int(spec.get("pad_id", 0))
    ids = torch.randint(5, 1000, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    ids[1, 6:] = pad_id
    path = out_dir / MODEL_FILE
    exporter = EXPORTERS[spec["kind"]]
    try:
        if exporter == "torchscript":
            axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
                    "logits": {0: "batch"}} if dynamic else None
            torch.onnx.export(model, (ids, mask), str(path), input_names=list(INPUT_NAMES),
                              output_names=[OUTPUT_NAME], opset_version=opset, dynamo=False,
                              dynamic_axes=axes, do_constant_folding=True)
        else:
            shapes = None
            if dynamic:
                batch = torch.export.Dim("batch", min=1)
                seq = torch.export.Dim("sequence", min=1, max=int(spec["max_length"]))
                shapes = ({0: batch, 1: seq}, {0: batch, 1: seq})
            program = torch.onnx.export(model, (ids, mask), input_names=list(INPUT_NAMES),
                                        output_names=[OUTPUT_NAME], opset_version=opset, dynamo=True,
                                        dynamic_shapes=shapes, external_data=False, verbose=False)
            program.save(str(path))
    except Exception as exc:
        raise ExportError(f"torch.onnx.export ({exporter}) failed at opset {opset}: {exc}") from exc
    for name in ("tokenizer.json", "labels.json"):
        shutil.copy2(model_dir / name, out_dir / name)
    labels = json.loads((model_dir / "labels.json").read_text())
    pre = {"max_length": int(spec["max_length"]), "pad_id": pad_id, "input_names": list(INPUT_NAMES),
           "output_name": OUTPUT_NAME, "num_classes": len(labels), "opset": opset,
           "model_kind": spec["kind"], "build": "fp32", "pooling": spec.get("pooling", "mean")}
    contract = json.loads((model_dir / "contract.json").read_text())
    pre |= {"text_preprocessing": contract["text_preprocessing"], "reject": contract["reject"]}
    (out_dir / "preprocessing.json").write_text(json.dumps(pre, indent=2))
    check_dynamic(path, max_length=int(spec["max_length"]), num_classes=len(labels))
    return out_dir


def check_dynamic(path: str | Path, max_length: int, num_classes: int) -> None:
    """The graph's batch and sequence axes are symbolic, and the session really runs at
    batch 1, 3, 17 and sequence 5 and 64 (capped at the model's max length)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        fixed = [i for i, d in enumerate(dims[:2]) if not d.dim_param]
        if fixed:
            shape = [d.dim_param or d.dim_value for d in dims]
            raise ExportError(f"exported graph has a fixed {'batch' if 0 in fixed else 'sequence'} "
                              f"axis: input {inp.name} has shape {shape}; export with dynamic axes")
    out_dims = model.graph.output[0].type.tensor_type.shape.dim
    if out_dims and not out_dims[0].dim_param:
        raise ExportError(f"exported graph has a fixed batch axis in its output "
                          f"({[d.dim_param or d.dim_value for d in out_dims]})")
    sess = session(path, threads=1)
    rng = np.random.default_rng(0)
    for b in CHECK_BATCHES:
        for s in sorted({min(x, max_length) for x in CHECK_SEQUENCES}):
            ids = rng.integers(5, 1000, (b, s), dtype=np.int64)
            mask = np.ones((b, s), dtype=np.int64)
            try:
                out = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            except Exception as exc:
                raise ExportError(f"the exported graph fails at batch {b}, sequence {s}: {exc}") from exc
            if out.shape != (b, num_classes):
                raise ExportError(f"the exported graph returns {out.shape} at batch {b}, "
                                  f"sequence {s}; expected {(b, num_classes)}")


# ---------------------------------------------------------------------------- parity


@dataclass
class Parity:
    rows: int
    max_abs_diff: float
    argmax_agreement: float
    differing_rows: list[dict[str, Any]]
    atol: float

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.atol and self.argmax_agreement == 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "max_abs_diff": self.max_abs_diff,
                "argmax_agreement": self.argmax_agreement, "atol": self.atol,
                "passed": self.passed, "first_differing_rows": self.differing_rows}


def torch_logits_fn(model) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    import torch

    def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(ids), torch.from_numpy(mask)).float().numpy()

    return run


def onnx_logits_fn(sess) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]

    return run


def batched_logits(fn, encoder: TextEncoder, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    out = [fn(*encoder(texts[i : i + batch_size])) for i in range(0, len(texts), batch_size)]
    return np.concatenate(out)


def parity(ref: np.ndarray, got: np.ndarray, row_ids: Sequence[str], atol: float,
           show: int = 5) -> Parity:
    diff = np.abs(ref - got).max(axis=1)
    agree = ref.argmax(1) == got.argmax(1)
    bad = np.flatnonzero((diff > atol) | ~agree)[:show]
    rows = [{"row": int(i), "record_id": str(row_ids[i]), "max_abs_diff": float(diff[i]),
             "argmax_torch": int(ref[i].argmax()), "argmax_onnx": int(got[i].argmax())} for i in bad]
    return Parity(len(ref), float(diff.max()) if len(diff) else 0.0,
                  float(agree.mean()) if len(agree) else 1.0, rows, atol)


def parity_message(p: Parity) -> str:
    rows = "; ".join(f"row {r['row']} (record {r['record_id']}): |diff| {r['max_abs_diff']:.2e}, "
                     f"argmax {r['argmax_torch']} vs {r['argmax_onnx']}" for r in p.differing_rows)
    return (f"fp32 parity failed on {p.rows} test rows: max |logit diff| {p.max_abs_diff:.3e} "
            f"(limit {p.atol:.0e}), argmax agreement {p.argmax_agreement:.4%}. First rows that "
            f"differ: {rows}")


# ---------------------------------------------------------------------------- int8


FUSIONS = ("none", "full", "no_attention")


def optimize(src: Path, dst: Path, spec: dict[str, Any], fusion: str) -> Path:
    """ONNX Runtime's transformer optimizer (graph fusions), or a copy for ``none``."""
    if fusion == "none":
        shutil.copy2(src, dst)
        return dst
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    opts = FusionOptions("bert")
    # No SkipLayerNormalization: slower than LayerNormalization + Add on CPU (measured, see
    # export.runtime.DISABLED_OPTIMIZERS).
    opts.enable_skip_layer_norm = False
    opts.enable_bias_skip_layer_norm = False
    if fusion == "no_attention":
        opts.enable_attention = False
    elif fusion != "full":
        raise ExportError(f"unknown fusion {fusion!r}; one of {FUSIONS}")
    model = optimizer.optimize_model(str(src), model_type="bert", num_heads=int(spec["num_heads"]),
                                     hidden_size=int(spec["hidden_size"]), optimization_options=opts,
                                     opt_level=0)
    model.save_model_to_file(str(dst))
    return dst


def quantize(src: Path, dst: Path, per_channel: bool, reduce_range: bool, work: Path,
             fp32_ffn_layers: int = 0) -> tuple[Path, list[str]]:
    """Dynamic int8 quantization; ``fp32_ffn_layers`` > 0 keeps the feed-forward MatMuls of
    that many first encoder layers in fp32 (``ffn_nodes``: that many first weight MatMuls
    where the graph has no BERT names). Returns the model and the nodes kept in fp32."""
    pre = work / f"pre-{src.stem}.onnx"
    with _quiet_root_logger():
        kept = _quantize(src, pre, dst, per_channel, reduce_range, fp32_ffn_layers)
    return dst, kept


_FFN = re.compile(r"layer\.(\d+)/(intermediate|output)/dense/MatMul")


def ffn_nodes(model_path: Path, layers: int) -> list[str]:
    """Feed-forward MatMul nodes of the first ``layers`` encoder layers (BERT naming). In a
    graph without those names (the small encoder, exported with generic node names): its
    first ``layers`` MatMul or Gemm nodes that multiply by a weight, in graph order, the
    earliest rounding error being the one every later layer carries (measured on the small
    encoder of the coarse-intent e2e run, 2026-12-06: argmax agreement with fp32 on
    Banking77's 3,080 test messages 99.09% all int8, 99.74% with the first one in fp32)."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    bert = [n.name for n in graph.node if n.op_type == "MatMul" and (m := _FFN.search(n.name))
            and int(m.group(1)) < layers]
    if bert or any(_FFN.search(n.name) for n in graph.node):
        return bert
    weights = {i.name for i in graph.initializer}
    return [n.name for n in graph.node
            if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in weights][:layers]


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    # onnxruntime.quantization logs a line per tensor through the root logger at INFO,
    # thousands of lines per build, which would bury the task log.
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        root.setLevel(level)


def _quantize(src: Path, pre: Path, dst: Path, per_channel: bool, reduce_range: bool,
              fp32_ffn_layers: int = 0) -> list[str]:
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if not pre.exists():
        # Symbolic shape inference cannot bound BERT's position slice (Min(512, sequence))
        # and gives up; ONNX's own shape inference and the optimizer pass still run.
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    exclude = ffn_nodes(pre, fp32_ffn_layers) if fp32_ffn_layers else []
    quantize_dynamic(str(pre), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                     reduce_range=reduce_range, nodes_to_exclude=exclude,
                     # Fused contrib ops have no ONNX shape inference; their outputs are float.
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})
    return exclude


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.argmax(1) == y).mean()) if len(y) else float("nan")


def int8_gate(fp32_acc: float, int8_acc: float, agreement: float, max_drop: float,
              min_agreement: float, oos_agreement: float | None = None,
              min_oos_agreement: float = 0.99) -> tuple[bool, str]:
    """``oos_agreement``: the share of rows on which the int8 build makes the fp32 build's
    out-of-scope decision under the stored reject rule (None: the build has no threshold)."""
    drop = fp32_acc - int8_acc
    problems = []
    if drop > max_drop + 1e-9:  # 1e-9: a drop of exactly the limit passes despite float error
        problems.append(f"accuracy drop {drop * 100:.2f} points > {max_drop * 100:.2f}")
    if agreement < min_agreement:
        problems.append(f"argmax agreement with fp32 {agreement:.2%} < {min_agreement:.2%}")
    if oos_agreement is not None and oos_agreement < min_oos_agreement:
        problems.append(f"out-of-scope decisions agree with fp32 on {oos_agreement:.2%} "
                        f"< {min_oos_agreement:.2%}")
    if problems:
        return False, "; ".join(problems)
    oos = (f", out-of-scope decisions {oos_agreement:.2%} (limit {min_oos_agreement:.2%})"
           if oos_agreement is not None else "")
    return True, (f"accuracy drop {drop * 100:.2f} points (limit {max_drop * 100:.2f}), "
                  f"agreement {agreement:.2%} (limit {min_agreement:.2%}){oos}")


# ---------------------------------------------------------------------------- timing


def hardware(threads: int) -> dict[str, Any]:
    import onnxruntime as ort
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": default_threads(), "threads": threads,
            "torch": torch.__version__, "onnxruntime": ort.__version__,
            "providers": ["CPUExecutionProvider"], "python": platform.python_version()}


def time_side_by_side(fns: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]],
                      encoder: TextEncoder, texts: Sequence[str], latency_samples: int,
                      throughput_batches: int, batch: int = 32, block: int = 10,
                      pause_s: float = 0.05) -> dict[str, dict[str, float]]:
    """Batch-1 latency and batch-32 throughput of each function, interleaved in blocks:
    ``block`` inputs through one build, the same inputs through the next, and so on, so a
    noisy neighbour slows every build alike. The first call after each switch is not
    timed (thread pools waking, caches). Times the model call only; inputs are tokenized
    beforehand.

    Each build runs as its runtime's defaults run it: ONNX Runtime's idle worker threads
    spin for the next call (as PyTorch's OpenMP threads do). A build's threads keep spinning
    for a moment after its last call, on the cores the next build needs; ``pause_s`` of
    sleep at every switch lets them park, so no build is timed against another's spinning
    threads. (Measured on 2 cores: without spinning, ONNX Runtime's batch-1 latency rose
    from 1.5 to 2.2-2.7 ms for int8 and 3.0 to 4.0 ms for fp32, thread wake-ups per call;
    spinning without the pause made fp32 at batch 32 take 78 ms instead of 46.)"""
    singles = [encoder([t]) for t in texts[:latency_samples]]
    batches = [encoder(texts[i : i + batch]) for i in range(0, batch * throughput_batches, batch)
               if len(texts[i : i + batch]) == batch]
    if not batches:
        raise ExportError(f"the speed report needs at least {batch} test texts, got {len(texts)}")
    lat: dict[str, list[float]] = {k: [] for k in fns}
    bat: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up: allocations, thread pools, lazy init
        for x in singles[:5] + batches[:2]:
            fn(*x)

    def timed(inputs: list, into: dict[str, list[float]], size: int) -> None:
        for i in range(0, len(inputs), size):
            chunk = inputs[i : i + size]
            for k, fn in fns.items():
                time.sleep(pause_s)
                fn(*chunk[0])
                for x in chunk:
                    t0 = time.perf_counter()
                    fn(*x)
                    into[k].append(time.perf_counter() - t0)

    timed(singles, lat, block)
    timed(batches, bat, max(1, block // 5))
    out = {}
    for k in fns:
        ms = np.array(lat[k]) * 1000
        b = np.array(bat[k])
        out[k] = {"p50_ms_b1": float(np.percentile(ms, 50)), "p99_ms_b1": float(np.percentile(ms, 99)),
                  "p50_ms_b32": float(np.median(b) * 1000),
                  "throughput_b32": float(batch * len(b) / b.sum())}
    return out


def size_mb(path: Path) -> float:
    return round(path.stat().st_size / 1e6, 2)
