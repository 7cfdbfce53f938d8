"""Cost: the arithmetic of core/cost.py (with the issue's worked example), the resources
core.stage.run_stage records around a stage's work (its own process, child processes and,
under spark-submit, the JVM), and where the figures show: the summary's ``cost`` line,
summary.json, the run report and MLflow."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT
from pydantic import ValidationError

from core import cost, runs, stage
from core.config import CostConfig, InstanceType, load_config

RUN_ID = "manual-cost-1"


def _burn(seconds: float) -> int:
    """Busy CPU in this process for about ``seconds`` of CPU time."""
    start = resource.getrusage(resource.RUSAGE_SELF)
    x = 0
    while True:
        for i in range(20_000):
            x += i * i
        now = resource.getrusage(resource.RUSAGE_SELF)
        if now.ru_utime + now.ru_stime - start.ru_utime - start.ru_stime >= seconds:
            return x


# --------------------------------------------------------------------------- arithmetic


def test_worked_example_100_gpu_instances_for_30_days():
    assert cost.instances_cost(100, 10.0, 30 * 24) == 720_000
    # The same through a price table and recorded resources: 100 one-GPU instances busy
    # for 30 days are 100 x 30 x 86,400 GPU-seconds.
    table = CostConfig(instance_types={"gpu": InstanceType(cores=8, memory_gib=64, gpus=1,
                                                           on_demand_per_hour=10.0, spot_per_hour=3.0)},
                       pipeline_instance="gpu", serving_instance="gpu")
    month = 30 * 86_400
    res = {"wall_seconds": month, "cpu_seconds": 100 * month, "gpu_seconds": 100 * month,
           "peak_rss_bytes": 8 * 2**30, "bytes_stored": 0, "bytes_read": 0}
    c = cost.cost_of(res, table, "train")
    assert c["instance_hours"] == pytest.approx(72_000)
    assert c["compute"] == pytest.approx(720_000) and c["total"] == pytest.approx(720_000)
    spot = cost.cost_of(res, table.model_copy(update={"spot": True}), "train")
    assert spot["compute"] == pytest.approx(216_000)  # 3 per hour


def test_share_basis_takes_the_largest_share_and_wall_basis_the_whole_instance():
    itype = InstanceType(cores=2, memory_gib=8, on_demand_per_hour=0.1)
    res = {"wall_seconds": 3600, "cpu_seconds": 1800, "peak_rss_bytes": 2 * 2**30}
    # CPU: 1800 core-s / 2 cores = 0.25 h; memory: 2/8 of the instance for 1 h = 0.25 h.
    assert cost.instance_hours(res, itype, "share") == pytest.approx(0.25)
    assert cost.instance_hours(res | {"peak_rss_bytes": 4 * 2**30}, itype, "share") == pytest.approx(0.5)
    assert cost.instance_hours(res, itype, "wall") == pytest.approx(1.0)


def test_storage_transfer_and_per_1000_predictions():
    assert cost.storage_cost(10 * 2**30, 0.023, 3) == pytest.approx(0.69)
    assert cost.transfer_cost(5 * 2**30, 0.01) == pytest.approx(0.05)
    table = CostConfig(instance_types={"box": InstanceType(cores=4, memory_gib=16, on_demand_per_hour=0.36)},
                       pipeline_instance="box", serving_instance="box")
    # 1,000 rows at 100 rows/s: 10 s of the whole instance (4 threads) = 0.001 per 1,000.
    assert cost.per_1k_predictions(100.0, 4, table) == pytest.approx(0.001)
    # Measured on one of the 4 cores: a quarter of the instance.
    assert cost.per_1k_predictions(100.0, 1, table) == pytest.approx(0.00025)
    with pytest.raises(ValueError):
        cost.per_1k_predictions(0.0, 1, table)


def test_price_table_rejects_unknown_names_and_missing_spot_prices():
    with pytest.raises(ValidationError, match="not in cost.instance_types"):
        load_config(overrides={"cost.pipeline_instance": "nope"})
    with pytest.raises(ValidationError, match="no stage trian"):
        load_config(overrides={"cost.stage_instances": {"trian": "g5.xlarge"}})
    with pytest.raises(ValidationError, match="no spot_per_hour"):
        load_config(overrides={"cost.spot": True, "cost.instance_types": {
            "od": {"cores": 2, "memory_gib": 4, "on_demand_per_hour": 0.1}}, "cost.pipeline_instance": "od",
            "cost.serving_instance": "od"})


def test_the_cost_section_is_in_no_stage_key(tmp_path):
    """Prices change, outputs do not: no stage's key config carries the cost section."""
    import ast

    for path in [*ROOT.glob("jobs/spark/*.py"), *ROOT.glob("quality/*_stage.py"), ROOT / "training" / "task.py",
                 ROOT / "training" / "register_stage.py", ROOT / "export" / "task.py", ROOT / "deploy" / "task.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "cost":
                pytest.fail(f"{path.name} reads cfg.cost")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "model_dump":
                assert not (isinstance(node.func.value, ast.Name) and node.func.value.id == "cfg"), \
                    f"{path.name} dumps the whole config (with its cost section) into a key"


# --------------------------------------------------------------------------- measuring a stage


def test_run_stage_records_cpu_memory_and_bytes(lake):
    payload = b"x" * 123_457

    def work(out: Path) -> dict:
        _burn(0.3)
        # A child process's CPU counts too (training runs in a torchrun child).
        subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import resource
            x = 0
            while resource.getrusage(resource.RUSAGE_SELF).ru_utime < 0.3:
                x += 1
            """)], check=True)
        (out / "data.bin").write_bytes(payload)
        return {"rows_in": 1}

    src = lake.parent / "raw.csv"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("id,text\n1,hello\n")
    r = stage.run_stage("s", lake, {"raw": stage.file_fingerprint(src)}, {"k": 1}, "code", work, RUN_ID)
    res = r.manifest["resources"]
    assert res["cpu_seconds"] >= 0.55  # this process 0.3 s + the child 0.3 s, less timer grain
    assert res["cpu_seconds"] <= res["wall_seconds"] * (res["cores"] or 1) + 0.1
    assert res["bytes_stored"] == len(payload)  # the output folder, before the manifest
    assert res["bytes_read"] == src.stat().st_size
    assert res["peak_rss_bytes"] > 10 * 2**20  # a Python process holds more than 10 MB
    assert res["gpus"] == 0 and res["gpu_seconds"] is None  # this machine has no GPU
    # Resources are not part of the key: the same stage again is a cache hit.
    again = stage.run_stage("s", lake, {"raw": stage.file_fingerprint(src)}, {"k": 1}, "code", work, RUN_ID)
    assert again.cache_hit and again.key == r.key
    # The next stage reads the published output: its bytes are what it moved.
    nxt = stage.run_stage("t", lake, {"s": {"key": r.key}}, {}, "code", lambda out: {}, RUN_ID)
    assert nxt.manifest["resources"]["bytes_read"] == len(payload)
    assert nxt.manifest["resources"]["bytes_stored"] == 0


def test_bytes_read_of_date_partitions_and_unknown_inputs(lake):
    raw = {"format": "csv", "partitions": {"date=2026-12-01": {"sha256": "a", "bytes": 300, "files": 1},
                                           "date=2026-12-02": {"sha256": "b", "bytes": 45, "files": 1}}}
    assert stage.inputs_bytes(lake, {"raw": raw}) == 345
    # A model read from the registry, a count, an upstream key not in the lake: not known.
    assert stage.inputs_bytes(lake, {"register": {"key": "nope"}, "accounting": {"rows_in": 3}}) is None


def test_failed_work_stops_the_meter(lake):
    import threading

    def boom(out: Path) -> dict:
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        stage.run_stage("s", lake, {}, {}, "c", boom)
    assert not [t for t in threading.enumerate() if t.name == "resource-meter"]


def test_spark_submit_stage_counts_the_jvm(tmp_path, project_env):
    """Under spark-submit the Python driver is the JVM's child and Spark's work runs in the
    JVM: the stage's CPU must include it, not only the driver's."""
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent("""
        import resource, sys
        from pathlib import Path
        from pyspark.sql import SparkSession
        from core import stage

        spark = SparkSession.builder.getOrCreate()

        def work(out):
            before = resource.getrusage(resource.RUSAGE_SELF)
            n = spark.range(0, 20_000_000, numPartitions=2).selectExpr("sum(id * id % 7) AS s").collect()[0].s
            after = resource.getrusage(resource.RUSAGE_SELF)
            (out / "n.txt").write_text(str(n))
            return {"driver_cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}

        stage.run_stage("sparkjob", Path(sys.argv[1]), {}, {}, "c", work, "r1")
        spark.stop()
        """))
    lake = tmp_path / "lake"
    proc = subprocess.run(["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                           str(job), str(lake)], env=project_env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = stage.read_manifest(next((lake / "sparkjob").iterdir()))
    res = m["resources"]
    assert res["measured"] == "process tree of the spark-submit JVM"
    assert res["cpu_seconds"] > m["stats"]["driver_cpu"] + 0.5, res


def test_in_process_spark_stage_counts_the_jvm(spark, lake):
    """Run by hand (``intentops clean``), Spark's JVM is a child of the stage's process,
    started before the stage: its CPU during the stage counts, its earlier CPU does not."""
    import psutil

    spark.range(0, 1000).count()  # the JVM is up before the stage starts
    jvms = [p for p in psutil.Process().children(recursive=True) if p.name() == "java"]
    assert jvms, "no Spark JVM under the test process"

    def jvm_cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in jvms)

    def work(out: Path) -> dict:
        before, jvm_before = resource.getrusage(resource.RUSAGE_SELF), jvm_cpu()
        # sha2 over strings: work whole-stage code generation cannot fold away
        n = spark.range(0, 600_000, numPartitions=2).selectExpr(
            "sha2(cast(id AS string), 512) AS h").selectExpr("count(DISTINCT h) AS s").collect()[0].s
        after = resource.getrusage(resource.RUSAGE_SELF)
        (out / "n.txt").write_text(str(n))
        return {"driver_cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                "jvm_cpu": jvm_cpu() - jvm_before, "jvm_before": jvm_before}

    r = stage.run_stage("sparkjob", lake, {}, {}, "c", work)
    res, stats = r.manifest["resources"], r.manifest["stats"]
    assert res["measured"] == "process tree of the stage"
    assert stats["jvm_cpu"] > 0.3, stats  # the JVM did the work, and the figure must show it
    # The stage's sampler reads the tree every 0.5 s: all of the driver's and most of the
    # JVM's CPU. The JVM's CPU before the stage (its start-up and every earlier query,
    # many seconds) is not counted; its JIT and GC threads go on for a moment after the
    # query returns, which the stage may count and `work` does not: hence the margin.
    assert res["cpu_seconds"] >= stats["driver_cpu"] + 0.7 * stats["jvm_cpu"], (res, stats)
    margin = 0.15 * stats["jvm_cpu"] + 1.0
    assert stats["jvm_before"] > 2 * margin, stats  # counting the earlier CPU would show
    assert res["cpu_seconds"] <= stats["driver_cpu"] + stats["jvm_cpu"] + margin, (res, stats)
    assert res["cpu_seconds"] <= res["wall_seconds"] * res["cores"] + 0.5, res


# --------------------------------------------------------------------------- where the figures show


def _export_row_stats() -> dict:
    return {"rows_in": None, "kept": None, "exported": True, "model_version": "1", "int8_status": "passed",
            "int8_reason": "agreement 100%", "sizes_mb": {b: 10.0 for b in ("pytorch_eager", "onnx_fp32", "onnx_int8")},
            "accuracy": {b: 0.9 for b in ("pytorch_eager", "onnx_fp32", "onnx_int8")},
            "p50_ms_b1": {b: 1.0 for b in ("pytorch_eager", "onnx_fp32", "onnx_int8")},
            "throughput_b32": {"pytorch_eager": 100.0, "onnx_fp32": 400.0, "onnx_int8": 800.0},
            "ratios": {"int8_speedup_vs_eager_b1": 2.0, "int8_throughput_vs_fp32_b32": 2.0,
                       "int8_size_share_of_fp32": 0.25}, "threads": 2}


@pytest.fixture
def priced_run(tmp_path):
    """A run whose clean stage burned CPU and stored a file, whose dedup stage was reused
    from an earlier run, and whose export measured both builds."""
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake")})

    def clean(out: Path) -> dict:
        _burn(0.2)
        (out / "kept.csv").write_text("id,text\n" + "1,hello\n" * 1000)
        return {"rows_in": 1000, "kept": 1000, "quarantined": 0}

    stage.run_stage("clean", cfg.lake, {"raw": "x"}, {}, "c", clean, "earlier")
    stage.run_stage("dedup", cfg.lake, {"clean": "x"}, {}, "c", lambda out: {"rows_in": 1000, "kept": 1000},
                    "earlier")
    stage.run_stage("clean", cfg.lake, {"raw": "y"}, {}, "c", clean, RUN_ID)
    stage.run_stage("dedup", cfg.lake, {"clean": "x"}, {}, "c", lambda out: {}, RUN_ID)  # a cache hit
    stage.run_stage("export", cfg.lake, {"register": "x"}, {}, "c", lambda out: _export_row_stats(), RUN_ID)
    runs.save_run_config(cfg, RUN_ID)
    return cfg


def test_summary_has_one_cost_line(priced_run, capsys):
    cfg = priced_run
    summary = Path(runs.write_summary(runs.run_dir(cfg.lake, RUN_ID) / "config.json", RUN_ID))
    text = runs.latest_summary(cfg.lake)
    lines = [ln for ln in text.splitlines() if ln.startswith("cost")]
    assert len(lines) == 1, text
    line = lines[0]
    rc = json.loads(summary.read_text())["cost"]
    assert line.startswith(f"cost USD {cost.money(rc['total'])} this run (clean ")
    assert "reused dedup" in line and "per 1,000 predictions fp32 " in line and ", int8 " in line
    assert rc["stages"]["clean"]["cache_hit"] is False and rc["stages"]["dedup"]["cache_hit"] is True
    clean_res = rc["stages"]["clean"]["resources"]
    assert clean_res["cpu_seconds"] > 0.15 and clean_res["bytes_stored"] == len("id,text\n" + "1,hello\n" * 1000)
    # The total counts the stages that ran (clean, export), not the reused dedup.
    assert rc["total"] == pytest.approx(rc["stages"]["clean"]["total"] + rc["stages"]["export"]["total"])
    # int8 at twice fp32's rows/s costs half as much per 1,000 predictions; the default
    # serving instance (2 cores) measured with 2 threads: 1000 / 400 / 3600 x its hourly price.
    per = rc["per_1k_predictions"]
    assert per["int8"] == pytest.approx(per["fp32"] / 2)
    hourly = cfg.cost.instance_types[cfg.cost.serving_instance].on_demand_per_hour
    assert per["fp32"] == pytest.approx(1000 / 400 / 3600 * hourly)
    # `intentops summary --run-id` prints the same line.
    from ops.cli import main

    capsys.readouterr()
    assert main(["summary", "--run-id", RUN_ID, "--config", str(_yaml(cfg))]) == 0
    assert [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cost")] == lines


def _yaml(cfg) -> Path:
    path = cfg.lake.parent / "pipeline.yaml"
    path.write_text(f"lake_root: {cfg.lake.parent}\n")
    return path


def test_report_has_the_cost_table(priced_run):
    from ops.report import build_report

    page = build_report(priced_run, RUN_ID).read_text()
    assert 'id="cost"' in page and 'href="#cost"' in page
    section = page.split('<section id="cost">')[1].split("</section>")[0]
    for text in ("CPU core-s", "peak memory MB", "stored MB", "total USD", "per 1,000 predictions, fp32 build",
                 "per 1,000 predictions, int8 build", "no GPU", "reused"):
        assert text in section, text


def test_cost_is_logged_to_mlflow(priced_run, tmp_path, monkeypatch):
    """The cost_* metrics and cost.json land on the run's training run in MLflow."""
    from mlflow.tracking import MlflowClient

    from ops.report import gather, log_cost

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = priced_run.model_copy(update={"tracking": priced_run.tracking.model_copy(update={"uri": uri})})
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "artifacts").as_uri())
    rid = client.create_run(exp).info.run_id
    stage.run_stage("train", cfg.lake, {"labelqa": "x"}, {}, "c",
                    lambda out: {"rows_in": None, "kept": None, "mlflow_run_id": rid}, RUN_ID)
    rep = gather(cfg, RUN_ID)
    assert log_cost(cfg, rep) == rid
    metrics = client.get_run(rid).data.metrics
    assert metrics["cost_run_total"] == pytest.approx(rep.cost["total"])
    assert metrics["cost_stage_clean"] == pytest.approx(rep.cost["stages"]["clean"]["total"])
    assert metrics["cost_per_1k_predictions_int8"] == pytest.approx(rep.cost["per_1k_predictions"]["int8"])
    arts = [a.path for a in client.list_artifacts(rid, f"cost/{RUN_ID}")]
    assert arts == [f"cost/{RUN_ID}/cost.json"]
