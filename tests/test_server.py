"""The model server as a real uvicorn process, under real concurrent HTTP load."""

from __future__ import annotations

import concurrent.futures as cf
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import ROOT, _free_port

from export import onnx_build

KEY = "test-key-not-secret"
OPERATOR = "test-operator-key-not-secret"


@pytest.fixture(scope="module")
def builds(trained, exported, tmp_path_factory) -> dict[str, Path]:
    store = tmp_path_factory.mktemp("store")  # what a deployment's builds/ folder is
    fp32b = onnx_build.export_fp32(trained["model_dir"], store / "second", opset=17)
    return {"int8": exported["out"] / "int8", "fp32": fp32b, "store": store}


def start(build_dir: Path, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "deploy.server", "--build", str(build_dir),
                             "--port", str(port), *extra], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        try:
            if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server never became ready")


@pytest.fixture
def server(builds, project_env):
    env = dict(project_env, INTENTOPS_API_KEYS=KEY, INTENTOPS_OPERATOR_KEYS=OPERATOR)
    proc, url = start(builds["int8"], env, "--max-batch", "16", "--max-delay-ms", "10", "--max-queue", "64",
                      "--build-store", str(builds["store"]))
    yield url
    proc.terminate()
    proc.wait(timeout=20)


H = {"Authorization": f"Bearer {KEY}"}
OP = {"Authorization": f"Bearer {OPERATOR}"}


def test_predict_validates_and_authenticates(server, trained):
    r = httpx.post(f"{server}/v1/predict", json={"texts": trained["texts"][:3]}, headers=H)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_version"] and len(body["predictions"]) == 3
    assert all(0 < p["score"] <= 1 for p in body["predictions"])
    assert httpx.post(f"{server}/v1/predict", json={"text": "hi"}).status_code == 401
    assert httpx.post(f"{server}/v1/predict", json={"text": "hi"},
                      headers={"X-API-Key": "wrong"}).status_code == 401
    assert httpx.post(f"{server}/v1/predict", json={"text": "hi"}, headers={"X-API-Key": KEY}).status_code == 200
    bad = [({"text": "   "}, 422, "empty"), ({"text": "x" * 1001}, 422, "at most 1000"),
           ({"texts": []}, 422, "empty"), ({"texts": ["a"] * 65}, 413, "at most 64"),
           ({"text": 5}, 422, "string"), ({"text": "a", "texts": ["b"]}, 422, "exactly one")]
    for payload, status, words in bad:
        r = httpx.post(f"{server}/v1/predict", json=payload, headers=H)
        assert r.status_code == status and words in r.text, (payload, r.status_code, r.text)
    secret = "call me on +44 7700 900123"
    r = httpx.post(f"{server}/v1/predict", json={"text": secret, "extra": 1}, headers=H)
    assert r.status_code == 422 and secret not in r.text  # errors never echo the input
    assert "/v1/predict" in httpx.get(f"{server}/openapi.json").json()["paths"]


def test_concurrent_load_is_micro_batched_and_metered(server, trained):
    texts = trained["texts"]

    def one(i: int) -> int:
        r = httpx.post(f"{server}/v1/predict", json={"text": texts[i % len(texts)]}, headers=H, timeout=30)
        return r.status_code

    with cf.ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(one, range(400)))
    assert codes.count(200) + codes.count(503) == 400 and codes.count(200) > 300
    m = httpx.get(f"{server}/metrics").text
    assert 'intentops_requests_total{status="200"}' in m
    # Batches of more than one text happened: the batch-size histogram's count is lower
    # than the number of texts served.
    batches = float(next(line.split()[-1] for line in m.splitlines()
                         if line.startswith("intentops_batch_size_count")))
    served = float(next(line.split()[-1] for line in m.splitlines()
                        if line.startswith("intentops_batch_size_sum")))
    assert batches < served
    assert "intentops_request_seconds_bucket" in m and "intentops_queue_depth" in m
    assert "intentops_model_info{" in m


def test_an_idle_server_does_not_wait_for_a_batch(builds, project_env, trained):
    # max_delay_ms is an upper bound for waiting under load, not a wait every request pays.
    env = dict(project_env, INTENTOPS_API_KEYS=KEY)
    proc, url = start(builds["int8"], env, "--max-delay-ms", "1000")
    try:
        with httpx.Client(base_url=url, headers=H, timeout=30) as client:
            seconds = []
            for text in trained["texts"][:5]:
                t0 = time.perf_counter()
                assert client.post("/v1/predict", json={"text": text}).status_code == 200
                seconds.append(time.perf_counter() - t0)
        assert max(seconds) < 0.5, seconds
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.parametrize("order", ["as_given", "short_first", "long_first"])
def test_length_sorted_sub_batches_answer_each_row_like_the_whole_batch(builds, trained, order):
    from deploy.server import predict_by_length
    from export.runtime import OnnxClassifier

    texts = [t * k for k, t in enumerate(trained["texts"][:12], start=1)]  # 1 to 12 copies: uneven lengths
    if order != "as_given":
        texts.sort(key=len, reverse=order == "long_first")
    clf = OnnxClassifier(builds["fp32"], threads=1)  # fp32: no batch-dependent activation scales
    want_labels, want_scores = clf.predict(texts)
    probs = predict_by_length(clf, texts)
    assert [clf.labels[i] for i in probs.argmax(1)] == want_labels
    assert probs.max(1).tolist() == pytest.approx(want_scores, abs=1e-4)


def _build_with_threshold(src: Path, dst: Path, threshold: float) -> Path:
    shutil.copytree(src, dst)
    pre = json.loads((dst / "preprocessing.json").read_text())
    pre["reject"] = pre["reject"] | {"threshold": threshold}
    (dst / "preprocessing.json").write_text(json.dumps(pre))
    return dst


def test_answers_out_of_scope_below_the_threshold_and_masks_requests(builds, trained, project_env, tmp_path):
    """The reject rule (here set at the median score of the texts sent, so both sides are
    exercised) and the request masking, through a real server process."""
    from contract.preprocess import Preprocessor
    from deploy.server import predict_by_length
    from export.runtime import OnnxClassifier

    texts = trained["texts"][:24] + ["what is the weather like in paris", "tell me a joke about cats"]
    clf = OnnxClassifier(builds["fp32"], threads=1)
    pre = Preprocessor(clf.pre["text_preprocessing"])
    scores = predict_by_length(clf, [pre(t) for t in texts]).max(1)
    t = float(np.median(scores))
    build = _build_with_threshold(builds["fp32"], tmp_path / "b", t)
    proc, url = start(build, dict(project_env, INTENTOPS_API_KEYS=KEY))
    try:
        ready = httpx.get(f"{url}/health/ready").json()
        assert ready | {"model_version": None, "cold_start_s": None, "text_preprocessing": None} == {
            "status": "ready", "model_version": None, "masking": True, "preprocessing_drift": False,
            "reject_threshold": t, "oos_label": None, "cold_start_s": None, "text_preprocessing": None}
        # What the router's cache masks with, and the time from process start to ready.
        assert ready["text_preprocessing"]["pii_mode"] == "placeholder" and ready["cold_start_s"] > 0
        got = httpx.post(f"{url}/v1/predict", json={"texts": texts}, headers=H).json()["predictions"]
        for a, s in zip(got, scores, strict=True):
            assert a["score"] == pytest.approx(float(s), abs=1e-4)
            if abs(s - t) > 1e-4:
                assert a["oos"] == (s < t) and a["abstain"] == (s < t), (a, s, t)
                assert (a["label"] is None) == (s < t)
        assert 0 < sum(a["oos"] for a in got) < len(got)
        # A request with personal data gets the answer of its masked form; one that is all
        # personal data is masked and answered.
        pairs = [("my name is Sarah Connor and my new card has not arrived",
                  "my name is <PERSON> and my new card has not arrived"),
                 ("send 200 euro to DE89 3704 0044 0532 0130 00 please",
                  "send 200 euro to <IBAN> please"),
                 ("sarah.connor@example.com", "<EMAIL>")]
        for raw, masked in pairs:
            a, b = httpx.post(f"{url}/v1/predict", json={"texts": [raw, masked]}, headers=H).json()["predictions"]
            assert a == b, (raw, a, b)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_build_whose_preprocessing_cannot_be_reproduced_is_refused(builds, tmp_path):
    from deploy.server import ModelServer, ServerConfig
    from export.runtime import BuildError

    drifted = tmp_path / "drifted"
    shutil.copytree(builds["fp32"], drifted)
    pre = json.loads((drifted / "preprocessing.json").read_text())
    pre["text_preprocessing"]["version"] = "0123456789abcdef"
    (drifted / "preprocessing.json").write_text(json.dumps(pre))
    with pytest.raises(BuildError, match="different PII detector"):
        ModelServer(ServerConfig(threads=1)).load(drifted, "1", "test")
    assert ModelServer(ServerConfig(threads=1, allow_preprocessing_drift=True)).load(
        drifted, "1", "test").preprocess.drift
    del pre["text_preprocessing"]
    (drifted / "preprocessing.json").write_text(json.dumps(pre))
    with pytest.raises(BuildError, match="records no text preprocessing"):
        ModelServer(ServerConfig(threads=1)).load(drifted, "1", "test")


def test_overload_is_shed_with_503_and_retry_after(builds, project_env, trained):
    env = dict(project_env, INTENTOPS_API_KEYS=KEY)
    proc, url = start(builds["int8"], env, "--max-batch", "1", "--max-delay-ms", "0", "--max-queue", "2",
                      "--threads", "1")
    try:
        payload = {"texts": trained["texts"][:64]}

        def one(_: int) -> httpx.Response:
            return httpx.post(f"{url}/v1/predict", json=payload, headers=H, timeout=60)

        with cf.ThreadPoolExecutor(24) as pool:
            rs = list(pool.map(one, range(48)))
        shed = [r for r in rs if r.status_code == 503]
        assert shed and all(r.headers.get("retry-after") == "1" for r in shed)
        assert all(r.status_code in (200, 503) for r in rs)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_hot_reload_drops_no_request(server, builds, trained):
    texts = trained["texts"]
    stop = time.time() + 6
    codes: list[int] = []

    def loop() -> None:
        i = 0
        while time.time() < stop:
            r = httpx.post(f"{server}/v1/predict", json={"text": texts[i % len(texts)]}, headers=H, timeout=30)
            codes.append(r.status_code)
            i += 1

    with cf.ThreadPoolExecutor(5) as pool:
        futs = [pool.submit(loop) for _ in range(4)]
        time.sleep(1.5)
        r = httpx.post(f"{server}/admin/reload", json={"build": str(builds["fp32"])}, headers=OP, timeout=60)
        assert r.status_code == 200, r.text
        for f in futs:
            f.result()
    assert codes and set(codes) == {200}, {c: codes.count(c) for c in set(codes)}
    assert httpx.get(f"{server}/health/ready").json()["model_version"] == builds["fp32"].name
    # A folder of the store that is not a build is refused (no path in the answer), and
    # the served model stays.
    (builds["store"] / "empty").mkdir(exist_ok=True)
    r = httpx.post(f"{server}/admin/reload", json={"build": str(builds["store"] / "empty")}, headers=OP, timeout=60)
    assert r.status_code == 422 and "could not be loaded" in r.text and str(builds["store"]) not in r.text
    assert httpx.post(f"{server}/v1/predict", json={"text": "hi"}, headers=H).json()["model_version"] == builds["fp32"].name


def test_one_bad_request_never_fails_its_batch_neighbours(builds, project_env, trained):
    """Invalid Unicode is a 422 for that request alone; a request that fails inside the
    model is retried alone and answered 500 alone; its concurrent neighbours all get 200."""
    env = dict(project_env, INTENTOPS_API_KEYS=KEY)
    proc, url = start(builds["int8"], env, "--max-batch", "32", "--max-delay-ms", "20",
                      "--inject-poison", "POISON-MARKER")
    try:
        texts = trained["texts"][:26]

        def one(i: int) -> int:
            if i == 5:
                body = b'{"text": "my card \\ud800 is lost"}'  # valid JSON, a lone surrogate
            elif i == 11:
                body = json.dumps({"text": "POISON-MARKER my card"}).encode()
            else:
                body = json.dumps({"text": texts[i]}).encode()
            r = httpx.post(f"{url}/v1/predict", content=body, timeout=30,
                           headers={**H, "content-type": "application/json"})
            return r.status_code

        for _ in range(3):  # several rounds: the bad ones land in shared batches
            with cf.ThreadPoolExecutor(26) as pool:
                codes = list(pool.map(one, range(26)))
            assert codes[5] == 422 and codes[11] == 500, codes
            assert [c for i, c in enumerate(codes) if i not in (5, 11)] == [200] * 24, codes
        r = httpx.post(f"{url}/v1/predict", content=b'{"text": "a \\udfff b"}', timeout=30,
                       headers={**H, "content-type": "application/json"})
        assert r.status_code == 422 and "not valid Unicode" in r.text
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_keys_bodies_and_reloads_fail_closed(server, builds, tmp_path):
    # any malformed or non-ASCII key is 401, never 500
    for value in ("Bearer clé".encode(), b"Bearer \xff\xfe",
                  b"Basic abc", b"Bearer"):
        r = httpx.post(f"{server}/v1/predict", json={"text": "hi"}, headers={"Authorization": value})
        assert r.status_code == 401, (value, r.status_code, r.text)
    # a body over the limit is 413 before it is read: by Content-Length, and chunked
    big = b'{"text": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    r = httpx.post(f"{server}/v1/predict", content=big, headers={**H, "content-type": "application/json"})
    assert r.status_code == 413
    r = httpx.post(f"{server}/v1/predict", content=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]),
                   headers={**H, "content-type": "application/json"})
    assert r.status_code == 413
    assert httpx.post(f"{server}/v1/predict", json={"text": "hi"}, headers=H).status_code == 200
    # roles: a client key may predict but not reload (403); an operator key may do both
    r = httpx.post(f"{server}/admin/reload", json={"build": str(builds["fp32"])}, headers=H, timeout=60)
    assert r.status_code == 403 and "client key may not" in r.text
    assert httpx.post(f"{server}/v1/predict", json={"text": "hi"}, headers=OP).status_code == 200
    # reload: only from the build store, only a build whose gate passed; no paths in errors
    outside = tmp_path / "outside"
    shutil.copytree(builds["fp32"], outside)
    r = httpx.post(f"{server}/admin/reload", json={"build": str(outside)}, headers=OP, timeout=60)
    assert r.status_code == 422 and "not in this server's build store" in r.text and str(tmp_path) not in r.text
    store = builds["store"]
    failed = store / "failed"
    shutil.copytree(builds["int8"], failed)
    pre = json.loads((failed / "preprocessing.json").read_text())
    (failed / "preprocessing.json").write_text(json.dumps(pre | {"status": "failed"}))
    r = httpx.post(f"{server}/admin/reload", json={"build": str(failed)}, headers=OP, timeout=60)
    assert r.status_code == 422 and "did not pass its export gate" in r.text
    del pre["status"]  # no gate status recorded: refused too (fail closed)
    (failed / "preprocessing.json").write_text(json.dumps(pre))
    r = httpx.post(f"{server}/admin/reload", json={"build": str(failed)}, headers=OP, timeout=60)
    assert r.status_code == 422 and "did not pass its export gate" in r.text
    escape = store / ".." / "outside"
    r = httpx.post(f"{server}/admin/reload", json={"build": str(escape)}, headers=OP, timeout=60)
    assert r.status_code == 422 and "build store" in r.text


def test_refuses_to_start_without_keys_and_a_failed_int8_build(builds, project_env, tmp_path):
    env = {k: v for k, v in project_env.items() if not k.startswith("INTENTOPS_API")}
    r = subprocess.run([sys.executable, "-m", "deploy.server", "--build", str(builds["int8"])],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no API key configured" in r.stderr
    from deploy.server import resolve_source

    mlmodel = tmp_path / "MLmodel"
    mlmodel.write_text("metadata:\n  intentops.status: failed\n")
    import mlflow.artifacts

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mlflow.artifacts, "download_artifacts", lambda artifact_uri, dst_path: str(tmp_path))
        with pytest.raises(ValueError, match="not a build that passed its export gate"):
            resolve_source(None, "models:/m-123", tmp_path)
    assert json.loads((builds["int8"] / "preprocessing.json").read_text())["status"] == "passed"
