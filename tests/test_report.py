"""The HTML run report (ops/report.py) and the Airflow plugin that serves it
(plugins/intentops_reports.py): a run that stopped at the validation gate still gets its
report; the plugin serves the report and the stage files it links and nothing else; the
page renders in a real headless Chromium (Debian's, `make browser`) with its charts decoded
and every link resolving. The same browser check runs on a real DAG run in
test_e2e_airflow.py (``check_page``, ``chromium``, ``serve`` and ``plugin_module`` are
shared with it)."""

from __future__ import annotations

import contextlib
import html
import importlib.util
import json
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import ROOT

from core import stage
from core.config import load_config
from core.runs import STAGES, save_run_config
from ops.report import REPORT_FILE, build_report, gather, log_to_mlflow, render

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
RUN_ID = "manual__2026-12-02T10:00:00+00:00"  # as Airflow names runs: ':' and '+' inside
RAW_VALUE = "alice.raw@example.com"  # stands for personal data in the raw zone
SECTIONS = ["contents", "overview", *(f"stage-{s}" for s in STAGES), "config"]


def plugin_module():
    spec = importlib.util.spec_from_file_location("intentops_reports", ROOT / "plugins" / "intentops_reports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def plugin_app(lake: Path):
    """The plugin's app over ``lake``, with Airflow's access check waived (there is no
    auth manager outside the API server; the check itself is Airflow's)."""
    mod = plugin_module()
    app = mod.create_app(lake)
    app.dependency_overrides[mod.require_run_access] = lambda: None
    return app


# --------------------------------------------------------------------------- a run stopped at the gate


def _publish(lake: Path, name: str, stats: dict, files: dict[str, str]) -> None:
    def work(out: Path) -> dict:
        for rel, text in files.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text)
        return stats

    stage.run_stage(name, lake, {"test": name}, {}, "test", work, RUN_ID)


def _data_stages(lake: Path, gate_passes: bool) -> str:
    """Publish clean, dedup, desensitize and the validation gate for RUN_ID; returns the
    gate's failure message."""
    _publish(lake, "clean", {"rows_in": 100, "kept": 90, "quarantined": 10,
                             "quarantine_by_reason": {"empty_text": 6, "mojibake": 4}},
             {"quarantine/rows.csv": f"id,text\n1,{RAW_VALUE}\n"})
    _publish(lake, "dedup", {"rows_in": 90, "kept": 80, "merged_exact": 7, "merged_near": 3},
             {"kept/rows.csv": f"id,text\n2,{RAW_VALUE}\n"})
    _publish(lake, "desensitize", {"rows_in": 90, "kept": 80, "merged": 10, "rows_with_pii": 12,
                                   "entities": {"EMAIL": 9, "PHONE": 4}},
             {"report.json": json.dumps({
                 "entities": {"EMAIL": 9, "PHONE": 4},
                 "parts": {"kept": {"rows": 80, "rows_with_pii": 10, "entities": {"EMAIL": 8, "PHONE": 3}},
                           "merged": {"rows": 10, "rows_with_pii": 2, "entities": {"EMAIL": 1, "PHONE": 1}}},
                 "masked_samples": {"EMAIL": ["write to <EMAIL> <please>"], "PHONE": ["call <PHONE>"]}})})
    failure = "expect_table_row_count_to_be_between: 80 rows < min_rows 1000"
    _publish(lake, "validate", {"rows_in": 80, "kept": 80, "success": gate_passes, "expectations": 2,
                                "failed_expectations": 0 if gate_passes else 1},
             {"validation_result.json": json.dumps({
                 "success": gate_passes, "row_count": 80, "failures": [] if gate_passes else [failure],
                 "expectations": [
                     {"check": "row_count", "type": "expect_table_row_count_to_be_between", "column": None,
                      "success": gate_passes, "observed_value": 80},
                     {"check": "not_null.text", "type": "expect_column_values_to_not_be_null", "column": "text",
                      "success": True, "element_count": 80, "unexpected_count": 0, "unexpected_percent": 0.0}],
                 "skipped": []}),
              "data_docs/index.html": "<!DOCTYPE html><html><head><title>Data Docs</title></head>"
                                      "<body><a href='validations/x.html'>result</a></body></html>",
              "data_docs/validations/x.html": "<html><body>expectation result</body></html>"})
    return failure


def _model_stages(lake: Path, tmp: Path) -> None:
    """Publish label QA, training, registration, export and a promoted canary for RUN_ID,
    with the files the report draws its charts from (numbers of the shape the stages write)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _publish(lake, "labelqa", {"rows_in": 80, "kept": 76, "suspects": 4, "suspect_rate": 0.05,
                               "krippendorff_alpha": 0.85, "gate_passed": True,
                               "curated_by_split": {"train": 60, "val": 8, "test": 8}, "mlflow_run_id": "abc"},
             {"metrics.json": json.dumps({"agreement": {"fleiss_kappa": 0.8}, "cleanlab_issues": 3,
                                          "consensus_method": "dawid_skene", "suspects_by_class": {"card": 3},
                                          "gate": {"passed": True, "checks": [
                                              {"name": "krippendorff_alpha >= min_alpha", "value": 0.85,
                                               "threshold": 0.8, "passed": True, "note": None}]}}),
              "qa_report.html": "<!DOCTYPE html><html><body>label QA</body></html>",
              "relabel_queue.csv": "rank,record_id\n1,r1\n"})
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.imshow([[3, 1], [0, 4]])
    fig.savefig(tmp / "cm.png")
    plt.close(fig)
    history = "".join(json.dumps({"step": i, "epoch": 0, "loss": 4 / i, "lr": 1e-3 * min(1, i / 3),
                                  "samples_per_s": 90.0}) + "\n" for i in range(1, 21))
    _publish(lake, "train", {"rows_in": None, "kept": None, "test_accuracy": 0.75, "test_macro_f1": 0.7,
                             "train_samples_per_s": 90.0, "mlflow_run_id": "def"},
             {"history.jsonl": history,
              "metrics.json": json.dumps({"model": "small", "world_size": 2, "steps": 20, "test_rows": 8,
                                          "stop_reason": "all epochs done", "val_history": [
                                              {"epoch": 0, "step": 10, "accuracy": 0.5, "macro_f1": 0.4, "loss": 2.0},
                                              {"epoch": 1, "step": 20, "accuracy": 0.7, "macro_f1": 0.6, "loss": 1.2}]})})
    shutil.copy(tmp / "cm.png", Path(stage.upstream(lake, RUN_ID, "train").path) / "confusion_matrix.png")
    _publish(lake, "register", {"rows_in": None, "kept": None, "registered": True, "version": "1",
                                "reason": "no champion yet"},
             {"decision.json": "{}", "behaviour.json": json.dumps({"passed": True, "checks": [
                 {"name": "invariance_lowercase", "rate": 1.0, "threshold": 0.95, "passed": True, "items": 8}]})})
    builds = {b: {"size_mb": size, "accuracy": 0.75, "p50_ms_b1": p50, "p99_ms_b1": p50 * 3, "throughput_b32": tp}
              for b, size, p50, tp in (("pytorch_eager", 16.8, 0.6, 130.0), ("onnx_fp32", 16.8, 0.3, 1000.0),
                                       ("onnx_int8", 4.2, 0.2, 1400.0))}
    ratios = {"int8_speedup_vs_eager_b1": 3.0, "int8_throughput_vs_fp32_b32": 1.4,
              "int8_size_share_of_fp32": 0.25, "int8_accuracy_drop_points": 0.0}
    _publish(lake, "export", {"rows_in": None, "kept": None, "exported": True, "model_version": "1",
                              "int8_status": "passed", "int8_reason": "agreement 100%", "ratios": ratios,
                              "sizes_mb": {}, "accuracy": {}, "p50_ms_b1": {}, "throughput_b32": {}},
             {"report.json": json.dumps({"builds": builds, "ratios": ratios, "test_rows": 8,
                                         "parity": {"max_abs_diff": 1e-6, "argmax_agreement": 1.0},
                                         "int8": {"status": "passed", "chosen": {"name": "none-pc1-rr0"}}}),
              "report.md": "# Export report\n"})
    timeline = [{"t": 0.5 * i, "weight": 1.0, "canary_error_rate": 0.0, "canary_p50_ms": 3.0,
                 "canary_p99_ms": 9.0 if i > 3 else None, "stable_p99_ms": None, "agreement": None,
                 "canary_accuracy": 0.75, "stable_accuracy": None, "canary_requests": 10 * i, "fallbacks": 0}
                for i in range(1, 9)]
    decision = {"version": "1", "decision": "promoted", "reason": "every check passed at 100% (first deployment)",
                "stable_version": None, "steps": [100], "steps_passed": 1, "client_requests": 80,
                "client_failures": 0, "fallbacks": 0, "accuracy": {"canary": 0.75, "stable": None},
                "p99_ms": {"canary": 9.0, "stable": None}, "error_rate": {"canary": 0.0, "stable": None},
                "seconds": 4.2}
    _publish(lake, "deploy", {"rows_in": None, "kept": None, **decision},
             {"rollout.json": json.dumps({**decision, "timeline": timeline,
                                          "events": [{"t": 0.0, "event": "weight 100%"},
                                                     {"t": 4.2, "event": "promoted"}]})})


@pytest.fixture
def gate_stopped(tmp_path: Path):
    """A run whose data stages published and whose validation gate failed."""
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake")})
    save_run_config(cfg, RUN_ID)
    return cfg, _data_stages(cfg.lake, gate_passes=False)


@pytest.fixture
def complete(tmp_path: Path):
    """A run through every stage, promoted."""
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake")})
    save_run_config(cfg, RUN_ID)
    _data_stages(cfg.lake, gate_passes=True)
    _model_stages(cfg.lake, tmp_path)
    return cfg


ALL_CHARTS = ["chart-rows", "chart-quarantine", "chart-pii", "chart-train-loss", "chart-train-val",
              "chart-confusion", "chart-export", "chart-canary"]


STATES = {"resolve_config": "success", "clean": "success", "dedup": "success", "desensitize": "success",
          "validate": "failed", "labelqa": "upstream_failed", "train": "upstream_failed",
          "register": "upstream_failed", "export": "upstream_failed", "deploy": "upstream_failed"}


def test_report_of_a_run_stopped_at_the_gate(gate_stopped):
    cfg, failure = gate_stopped
    path = build_report(stage.run_dir(cfg.lake, RUN_ID) / "config.json", RUN_ID, STATES)
    assert path == stage.run_dir(cfg.lake, RUN_ID) / REPORT_FILE
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # atomic write
    page = path.read_text()
    for sid in SECTIONS:
        assert f'id="{sid}"' in page, sid
    assert "stopped at validate" in page and html.escape(failure) in page
    section = page.split('id="stage-labelqa"')[1].split("</section>")[0]
    assert "not run" in section and "an upstream stage failed" in section
    for chart in ("chart-rows", "chart-quarantine", "chart-pii"):
        assert f'<figure id="{chart}"><img src="data:image/png;base64,' in page, chart
    assert "chart-train-loss" not in page and "chart-canary" not in page
    # Text is escaped; the only links are anchors and the gate's stage files via the plugin.
    assert "write to &lt;EMAIL&gt; &lt;please&gt;" in page
    hrefs = re.findall(r'<a href="([^"]*)"', page)
    assert {h for h in hrefs if not h.startswith("#")} == {
        "files/validate/data_docs/index.html", "files/desensitize/report.json"}
    assert RAW_VALUE not in page and str(cfg.lake) not in page  # no raw zone, no machine paths


def test_report_of_a_run_with_no_outputs(tmp_path):
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake")})
    page = build_report(cfg, "scheduled__2026-12-01T00:00:00+00:00").read_text()
    assert page.count(">not run<") >= len(STAGES)
    assert "incomplete" in page


def test_report_of_a_complete_run_has_every_chart(complete):
    page = build_report(complete, RUN_ID).read_text()
    for chart in ALL_CHARTS:
        assert f'<figure id="{chart}"><img src="data:image/png;base64,' in page, chart
    assert ">not run<" not in page and "every stage ran" in page
    assert "promoted" in page and "every check passed at 100%" in page
    hrefs = {h for h in re.findall(r'<a href="([^"]*)"', page) if not h.startswith("#")}
    assert "files/labelqa/qa_report.html" in hrefs and "files/export/report.md" in hrefs
    assert all(h.startswith("files/") for h in hrefs)


def test_mlflow_copy_links_nothing_outside_itself(gate_stopped, caplog):
    cfg, _ = gate_stopped
    page = render(gather(cfg, RUN_ID, STATES), "mlflow")
    assert all(h.startswith("#") for h in re.findall(r'<a href="([^"]*)"', page))
    assert "validate/" in page and "data_docs/index.html" in page  # named instead
    with caplog.at_level("INFO", logger="ops.report"):
        assert log_to_mlflow(cfg, RUN_ID) is None  # no version registered: nothing to attach to
    assert "registered no model version" in caplog.text


# --------------------------------------------------------------------------- the plugin


@pytest.fixture
def client(gate_stopped):
    from fastapi.testclient import TestClient

    cfg, _ = gate_stopped
    build_report(cfg, RUN_ID, STATES)
    return TestClient(plugin_app(cfg.lake)), cfg


def test_plugin_serves_the_report_and_its_stage_files(client):
    c, cfg = client
    base = f"/runs/{quote(RUN_ID, safe='')}"  # the UI fills {RUN_ID} with encodeURIComponent
    r = c.get(f"{base}/report")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.text == (stage.run_dir(cfg.lake, RUN_ID) / REPORT_FILE).read_text()
    r = c.get(f"{base}/files/validate/data_docs/index.html")
    assert r.status_code == 200 and "Data Docs" in r.text
    assert c.get(f"{base}/files/validate/data_docs/validations/x.html").status_code == 200
    assert c.get(f"{base}/files/desensitize/report.json").json()["entities"]["EMAIL"] == 9
    assert c.get("/runs/no_such_run/report").status_code == 404


@pytest.mark.parametrize("path", [
    "files/clean/quarantine/rows.csv",  # the raw zone is never served
    "files/dedup/kept/rows.csv",
    "files/validate/../clean/quarantine/rows.csv",
    "files/validate/data_docs/../../../clean/x/quarantine/rows.csv",
    "files/validate/%2e%2e/%2e%2e/clean/x/quarantine/rows.csv",
    "files/validate/data_docs/%2e%2e/_MANIFEST.json",
    "files/validate/_MANIFEST.json",  # not a file the report links
    "files/validate/data_docs/escape.txt",  # a symlink out of the stage's output
    "files/labelqa/qa_report.html",  # a stage this run did not reach
    "files/nosuch/report.json",
    "files/validate/%2Fetc%2Fpasswd",
])
def test_plugin_refuses_anything_else(client, path):
    c, cfg = client
    out = Path(stage.upstream(cfg.lake, RUN_ID, "validate").path)
    outside = cfg.lake.parent / "secret.txt"
    outside.write_text(RAW_VALUE)
    (out / "data_docs" / "escape.txt").symlink_to(outside)
    r = c.get(f"/runs/{quote(RUN_ID, safe='')}/{path}")
    assert r.status_code == 404, (path, r.status_code)
    assert RAW_VALUE not in r.text


@pytest.mark.parametrize("run", ["..", ".", "%2e%2e", "..%2F..%2Fetc"])
def test_plugin_refuses_run_ids_outside_the_runs_folder(client, run):
    c, _ = client
    assert c.get(f"/runs/{run}/report").status_code == 404
    assert c.get(f"/runs/{run}/files/validate/validation_result.json").status_code == 404


def test_plugin_registers_a_tab_on_the_run_page_and_checks_access():
    mod = plugin_module()
    plugin = mod.IntentopsReportsPlugin
    (view,) = plugin.external_views
    assert view["destination"] == "dag_run" and view["url_route"]
    assert view["href"] == "intentops/runs/{RUN_ID}/report"  # relative: works under a base URL
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == "/intentops"
    deps = [d.dependency for d in app["app"].router.dependencies]
    assert mod.require_run_access in deps


# --------------------------------------------------------------------------- the browser


@contextlib.contextmanager
def serve(app) -> Iterator[str]:
    """``app`` on a local uvicorn server (a thread); yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def chromium(tmp_path: Path):
    """Debian's headless Chromium through its own chromedriver; nothing is downloaded."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        # `make test` installs it (make browser); a missing browser is a failed check, not a skip.
        pytest.fail("Chromium is not installed: run `make browser` (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)


def check_page(driver, url: str, charts: list[str], base: str | None = None) -> dict:
    """Open ``url`` and check: no console errors, every section, every chart image decoded,
    every anchor's target in the page, every other link answering 200 under ``base`` (no
    other link at all without one), nothing fetched from elsewhere."""
    import httpx

    driver.get(url)
    assert driver.execute_script("return document.readyState") == "complete"
    driver.execute_script("return new Promise(r => Promise.all(Array.from(document.images)"
                          ".map(i => i.decode().catch(() => null))).then(r))")
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    ids = set(driver.execute_script("return Array.from(document.querySelectorAll('[id]')).map(e => e.id)"))
    missing = [s for s in SECTIONS if s not in ids]
    assert not missing, missing
    images = driver.execute_script(
        "return Array.from(document.images).map(i => ({id: i.closest('figure') && i.closest('figure').id,"
        " complete: i.complete, width: i.naturalWidth, height: i.naturalHeight}))")
    for img in images:
        assert img["complete"] and img["width"] > 0 and img["height"] > 0, img
    shown = {img["id"] for img in images}
    assert set(charts) <= shown, set(charts) - shown
    links = driver.execute_script(
        "return Array.from(document.querySelectorAll('a[href]')).map(a => [a.getAttribute('href'), a.href])")
    external = []
    for raw, resolved in links:
        if raw.startswith("#"):
            assert raw[1:] in ids, raw
            continue
        assert base and resolved.startswith(base + "/"), (raw, resolved)
        r = httpx.get(resolved, timeout=30)
        assert r.status_code == 200, (raw, resolved, r.status_code)
        external.append(resolved)
    fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(base and f.startswith(base + "/") for f in fetched), fetched
    return {"ids": ids, "charts": shown, "links": external, "anchors": len(links) - len(external)}


def test_report_of_a_stopped_run_in_chromium(gate_stopped, tmp_path):
    cfg, _ = gate_stopped
    build_report(cfg, RUN_ID, STATES)
    with serve(plugin_app(cfg.lake)) as base, chromium(tmp_path) as driver:
        url = f"{base}/runs/{quote(RUN_ID, safe='')}/report"
        seen = check_page(driver, url, ["chart-rows", "chart-quarantine", "chart-pii"], base)
        assert len(seen["links"]) == 2 and seen["anchors"] >= len(SECTIONS)
        # The MLflow rendering, opened as a file as MLflow's artifact view would hand it over.
        copy = tmp_path / "mlflow-copy.html"
        copy.write_text(render(gather(cfg, RUN_ID, STATES), "mlflow"))
        seen = check_page(driver, copy.as_uri(), ["chart-rows", "chart-pii"])
        assert seen["links"] == []


def test_report_of_a_complete_run_in_chromium(complete, tmp_path):
    build_report(complete, RUN_ID)
    with serve(plugin_app(complete.lake)) as base, chromium(tmp_path) as driver:
        seen = check_page(driver, f"{base}/runs/{quote(RUN_ID, safe='')}/report", ALL_CHARTS, base)
        assert len(seen["links"]) >= 8
