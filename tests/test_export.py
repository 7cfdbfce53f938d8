"""ONNX export: parity, dynamic axes, the int8 gate passing and failing, bad input.

One small encoder is trained once for the session (conftest ``trained`` (a real ``training.train`` process on
eight Banking77 classes)); every test exports or quantizes that model for real."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import EXPORT_CLASSES as CLASSES

from core.config import ExportConfig
from export import build, onnx_build
from export.runtime import BuildError, OnnxClassifier, TextEncoder, session

MAX_LEN = 64  # the fixture's max_length; the dynamic-axes check runs sequence 64


def small_cfg(**kw) -> ExportConfig:
    return ExportConfig(**({"fusions": ["none", "full"], "per_channel": [False, True],
                            "reduce_range": [False], "latency_samples": 20, "throughput_batches": 3,
                            "candidate_batches": 2} | kw))


def torch_model(model_dir: Path):
    from training.models import load_trained

    return load_trained(model_dir)[0]


def test_export_has_dynamic_axes_and_matches_pytorch_at_every_shape(trained, tmp_path):
    d = onnx_build.export_fp32(trained["model_dir"], tmp_path / "fp32", opset=17)
    g = onnx.load(str(d / "model.onnx"))
    assert [(i.name, [x.dim_param for x in i.type.tensor_type.shape.dim]) for i in g.graph.input] == [
        ("input_ids", ["batch", "sequence"]), ("attention_mask", ["batch", "sequence"])]
    assert {o.domain: o.version for o in g.opset_import}[""] == 17
    pre = json.loads((d / "preprocessing.json").read_text())
    assert pre["max_length"] == MAX_LEN and pre["input_names"] == ["input_ids", "attention_mask"]
    assert json.loads((d / "labels.json").read_text()) == json.loads(
        (trained["model_dir"] / "labels.json").read_text())
    ref, sess = onnx_build.torch_logits_fn(torch_model(trained["model_dir"])), session(d / "model.onnx")
    rng = np.random.default_rng(1)
    for b in (1, 3, 17):
        for s in (5, 64):
            ids = rng.integers(5, 1000, (b, s), dtype=np.int64)
            mask = np.ones((b, s), dtype=np.int64)
            mask[0, s // 2:] = 0  # a padded row
            got = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            assert got.shape == (b, len(CLASSES))
            assert np.abs(got - ref(ids, mask)).max() <= 1e-4


def test_build_all_parity_int8_gate_and_report(trained, tmp_path):
    from training.predictor import Predictor

    rep = build.build_all(trained["model_dir"], trained["texts"], trained["labels"], trained["ids"],
                          small_cfg(), tmp_path)
    assert rep["parity"]["passed"] and rep["parity"]["rows"] == len(trained["texts"]) == 320
    assert rep["parity"]["max_abs_diff"] <= 1e-4 and rep["parity"]["argmax_agreement"] == 1.0
    assert rep["int8"]["status"] == "passed", rep["int8"]
    names = {c["name"] for c in rep["candidates"]}
    assert names == {"none-pc0-rr0", "none-pc1-rr0", "full-pc0-rr0", "full-pc1-rr0"}
    chosen = next(c for c in rep["candidates"] if c["name"] == rep["int8"]["chosen"]["name"])
    assert chosen["passed"] and chosen["throughput_b32"] == max(
        c["throughput_b32"] for c in rep["candidates"] if c["passed"])
    for b in ("pytorch_eager", "onnx_fp32", "onnx_int8"):
        v = rep["builds"][b]
        assert v["p99_ms_b1"] >= v["p50_ms_b1"] > 0 and v["throughput_b32"] > 0 and v["size_mb"] > 0
    assert rep["builds"]["onnx_int8"]["size_mb"] < 0.5 * rep["builds"]["onnx_fp32"]["size_mb"]
    assert rep["hardware"]["threads"] >= 1 and rep["hardware"]["onnxruntime"]
    for f in ("report.json", "report.md", "speed.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert not (tmp_path / ".work").exists()
    pre = json.loads((tmp_path / "int8" / "preprocessing.json").read_text())
    assert pre["build"] == "int8" and pre["status"] == "passed"
    assert set(pre["quantization"]) >= {"per_channel", "reduce_range", "fusion"}
    # The model's contract travels with every build, and the int8 build keeps the reject
    # rule's decisions within the gate's tolerance (every candidate was checked).
    contract = json.loads((trained["model_dir"] / "contract.json").read_text())
    for b in ("fp32", "int8"):
        built = json.loads((tmp_path / b / "preprocessing.json").read_text())
        assert built["reject"] == contract["reject"] and built["text_preprocessing"] == contract["text_preprocessing"]
    assert contract["reject"]["threshold"] is not None
    assert rep["reject"]["oos_agreement"] >= small_cfg().min_oos_agreement
    assert all(c["oos_agreement"] is not None for c in rep["candidates"] if "error" not in c)
    assert "Reject rule: max-softmax threshold" in (tmp_path / "report.md").read_text()
    # The int8 build predicts from text alone, like PyTorch does.
    onnx_labels, _ = OnnxClassifier(tmp_path / "int8").predict(trained["texts"])
    torch_labels, _ = Predictor(trained["model_dir"]).predict(trained["texts"])
    assert np.mean(np.array(onnx_labels) == np.array(torch_labels)) >= 0.99


def test_corrupted_int8_weights_fail_the_gate_and_are_marked(trained, tmp_path, monkeypatch):
    real = onnx_build.quantize

    def corrupted(src, dst, per_channel, reduce_range, work, fp32_ffn_layers=0):
        path, kept = real(src, dst, per_channel, reduce_range, work, fp32_ffn_layers)
        m = onnx.load(str(path))
        rng = np.random.default_rng(0)
        for init in m.graph.initializer:
            if init.data_type == onnx.TensorProto.INT8:
                arr = onnx.numpy_helper.to_array(init)
                init.CopyFrom(onnx.numpy_helper.from_array(rng.permutation(arr.ravel()).reshape(arr.shape),
                                                           init.name))
        onnx.save(m, str(path))
        return path, kept

    monkeypatch.setattr(onnx_build, "quantize", corrupted)
    rep = build.build_all(trained["model_dir"], trained["texts"], trained["labels"], trained["ids"],
                          small_cfg(fusions=["none"], per_channel=[False]), tmp_path)
    assert rep["int8"]["status"] == "failed"
    assert "agreement" in rep["int8"]["reason"] or "accuracy drop" in rep["int8"]["reason"]
    pre = json.loads((tmp_path / "int8" / "preprocessing.json").read_text())
    assert pre["status"] == "failed"  # attached for inspection, refused by serving


def test_mixed_precision_fallback_finds_the_first_layers_feed_forward_nodes(tmp_path):
    from onnx import TensorProto, helper

    names = [f"/encoder/layer.{i}/{part}/MatMul" for i in range(3)
             for part in ("attention/self/query", "intermediate/dense", "output/dense")]
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=n) for i, n in enumerate(names)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 4])
                               for i in range(len(nodes))],
                              [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [4, 4], [0.0] * 16)
                               for i in range(len(nodes))])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    assert onnx_build.ffn_nodes(tmp_path / "m.onnx", 0) == []
    assert onnx_build.ffn_nodes(tmp_path / "m.onnx", 1) == [
        "/encoder/layer.0/intermediate/dense/MatMul", "/encoder/layer.0/output/dense/MatMul"]
    assert len(onnx_build.ffn_nodes(tmp_path / "m.onnx", 2)) == 4  # attention stays quantized


def test_mixed_precision_fallback_without_bert_names_keeps_the_first_weight_matmuls(tmp_path):
    """The small encoder's graph has generic node names: the fallback keeps its first weight
    MatMuls (or Gemms) in fp32, never one that multiplies two activations (attention)."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["y0"], name="node_MatMul_16"),
        helper.make_node("MatMul", ["y0", "x"], ["y1"], name="node_MatMul_108"),  # no weight
        helper.make_node("Gemm", ["y1", "w1"], ["y2"], name="node_linear_1"),
        helper.make_node("MatMul", ["y2", "w2"], ["y3"], name="node_MatMul_121"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y3", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [4, 4], [0.0] * 16) for i in range(3)])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    assert onnx_build.ffn_nodes(tmp_path / "m.onnx", 0) == []
    assert onnx_build.ffn_nodes(tmp_path / "m.onnx", 1) == ["node_MatMul_16"]
    assert onnx_build.ffn_nodes(tmp_path / "m.onnx", 2) == ["node_MatMul_16", "node_linear_1"]


def test_int8_gate_limits():
    assert onnx_build.int8_gate(0.90, 0.896, 0.995, 0.005, 0.99)[0]
    ok, why = onnx_build.int8_gate(0.90, 0.89, 0.995, 0.005, 0.99)
    assert not ok and "accuracy drop 1.00 points" in why
    ok, why = onnx_build.int8_gate(0.90, 0.90, 0.98, 0.005, 0.99)
    assert not ok and "agreement" in why


def test_parity_failure_names_the_first_differing_rows():
    ref = np.zeros((6, 3), dtype=np.float32)
    ref[:, 0] = 1.0
    got = ref.copy()
    got[2, 1] = 5.0  # argmax flips
    got[4, 2] = 2e-3  # beyond tolerance, same argmax
    p = onnx_build.parity(ref, got, [f"r{i}" for i in range(6)], atol=1e-4)
    assert not p.passed and [r["row"] for r in p.differing_rows] == [2, 4]
    msg = onnx_build.parity_message(p)
    assert "row 2 (record r2)" in msg and "row 4 (record r4)" in msg and "5.000e+00" in msg


def test_fixed_batch_graph_is_rejected(trained, tmp_path):
    with pytest.raises(onnx_build.ExportError, match="fixed batch axis"):
        onnx_build.export_fp32(trained["model_dir"], tmp_path, opset=17, dynamic=False)


def test_unsupported_opset_fails_clearly(trained, tmp_path):
    assert onnx_build.runtime_supports_opset(17)[0]
    with pytest.raises(onnx_build.ExportError, match="opset 99 is outside"):
        onnx_build.export_fp32(trained["model_dir"], tmp_path, opset=99)
    ok, why = onnx_build.runtime_supports_opset(99)
    assert not ok and why


def test_model_folder_without_artifacts_fails_clearly(trained, tmp_path):
    partial = tmp_path / "model"
    shutil.copytree(trained["model_dir"], partial)
    (partial / "tokenizer.json").unlink()
    with pytest.raises(onnx_build.ExportError, match="lacks tokenizer.json"):
        onnx_build.export_fp32(partial, tmp_path / "out", opset=17)
    with pytest.raises(BuildError, match="lacks"):
        OnnxClassifier(tmp_path)


def test_text_encoder_pads_to_the_longest_row_and_truncates(trained):
    enc = TextEncoder(trained["model_dir"] / "tokenizer.json", 8, 0)
    ids, mask = enc(["hi", "a much longer message about my card that never arrived"])
    assert ids.shape == mask.shape == (2, 8) and ids.dtype == np.int64
    assert mask[0].sum() < 8 and mask[1].sum() == 8 and (ids[0][mask[0] == 0] == 0).all()


def test_builds_attach_to_a_version_once_and_a_version_without_a_model_fails(
        trained, tmp_path, mlflow_server, monkeypatch):
    import uuid

    import mlflow
    from mlflow.tracking import MlflowClient

    from core.config import load_config
    from export import task

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    cfg = load_config(env={"MLFLOW_TRACKING_URI": mlflow_server})
    out = tmp_path / "builds"
    rep = build.build_all(trained["model_dir"], trained["texts"], trained["labels"], trained["ids"],
                          small_cfg(fusions=["none"], per_channel=[True]), out)
    client = MlflowClient(mlflow_server)
    exp = client.create_experiment(f"export-attach-{uuid.uuid4().hex[:8]}")
    rid = client.create_run(exp).info.run_id
    note = tmp_path / "README.txt"
    note.write_text("not a model")
    client.log_artifact(rid, str(note), artifact_path="model")
    name = f"export-attach-{uuid.uuid4().hex[:8]}"
    client.create_registered_model(name)
    mv = client.create_model_version(name, source=f"runs:/{rid}/model", run_id=rid)
    with pytest.raises(onnx_build.ExportError, match="has no trained model folder"):
        task.model_dir_of_version(cfg, name, mv.version, tmp_path / "dl")

    uris = task.attach(cfg, name, mv.version, out, rep, key="key-1")
    tags = client.get_model_version(name, mv.version).tags
    assert tags["intentops.onnx.int8.status"] == "passed" and tags[task.KEY_TAG] == "key-1"
    assert tags["intentops.onnx.int8.model_uri"] == uris["int8"]
    assert client.get_run(rid).data.metrics["export_onnx_int8_size_mb"] == rep["builds"]["onnx_int8"]["size_mb"]
    models = client.search_logged_models(experiment_ids=[exp])
    assert sorted(m.tags.get("intentops.build") for m in models) == ["fp32", "int8"]
    # Attaching again for the same export key reuses the builds: no third logged model.
    assert task.attach(cfg, name, mv.version, out, rep, key="key-1") == uris
    assert len(client.search_logged_models(experiment_ids=[exp])) == 2
    mlflow.set_tracking_uri(mlflow_server)
    folder = mlflow.artifacts.download_artifacts(artifact_uri=uris["int8"], dst_path=str(tmp_path / "int8"))
    labels, scores = OnnxClassifier(folder).predict(trained["texts"][:5])
    assert len(labels) == 5 and all(0 < s <= 1 for s in scores)
