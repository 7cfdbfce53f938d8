"""The router as a real process in front of real model servers."""

from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import time

import httpx
import pytest
from conftest import ROOT, _free_port
from test_server import start

from deploy.router import Routes, choose, sticky_share

CLIENT, INTERNAL, ADMIN = "client-key", "internal-key", "admin-key"
H = {"Authorization": f"Bearer {CLIENT}"}
A = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def servers(exported, project_env):
    env = dict(project_env, INTENTOPS_API_KEYS=INTERNAL)
    build = exported["out"] / "int8"
    procs = [start(build, env), start(build, env, "--inject-fail-rate", "0.5"),
             start(build, env, "--inject-delay-ms", "50")]
    yield {"stable": procs[0][1], "flaky": procs[1][1], "slow": procs[2][1]}
    for p, _ in procs:
        p.terminate()
        p.wait(timeout=20)


def start_router(stable: str, env: dict[str, str], *extra: str):
    port = _free_port()
    env = dict(env, INTENTOPS_API_KEYS=CLIENT, INTENTOPS_UPSTREAM_KEY=INTERNAL, INTENTOPS_ADMIN_KEYS=ADMIN)
    proc = subprocess.Popen([sys.executable, "-m", "deploy.router", "--stable", stable,
                             "--port", str(port), *extra], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, url


@pytest.fixture
def router(servers, project_env):
    proc, url = start_router(servers["stable"], project_env)
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def routes(url, **upd):
    r = httpx.put(f"{url}/admin/routes", json=upd, headers=A)
    assert r.status_code == 200, r.text
    return r.json()


def send(url, n, key=None, workers=4):
    def one(i):
        headers = H | ({"X-Routing-Key": key(i)} if key else {})
        r = httpx.post(f"{url}/v1/predict", json={"text": f"where is my card number {i}"}, headers=headers,
                       timeout=30)
        return r.status_code, r.headers.get("x-variant")

    with cf.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, range(n)))


def test_sticky_hash_is_stable_and_monotone_in_the_weight():
    import random

    r = Routes(stable="s", canary="c", weight=0.3)
    assert all(choose(r, "customer-42", random.Random(i)) == choose(r, "customer-42", random.Random(0))
               for i in range(20))
    keys = [f"k{i}" for i in range(2000)]
    at_30 = {k for k in keys if choose(r, k, random.Random()) == "canary"}
    at_60 = {k for k in keys if choose(Routes("s", "c", 0.6), k, random.Random()) == "canary"}
    assert at_30 <= at_60  # raising the weight only moves customers to the canary
    assert 0.25 < len(at_30) / 2000 < 0.35 and 0 <= sticky_share("x") < 1


def test_weighted_split_sticky_routing_auth_and_admin(router, servers):
    assert httpx.post(f"{router}/v1/predict", json={"text": "hi"}).status_code == 401
    assert httpx.put(f"{router}/admin/routes", json={"weight": 1}, headers=H).status_code == 403  # client role
    assert httpx.put(f"{router}/admin/routes", json={"weight": 1},
                     headers={"Authorization": "Bearer nobody"}).status_code == 401
    routes(router, canary=servers["stable"], weight=0.3)
    got = send(router, 200)
    assert {s for s, _ in got} == {200}
    share = sum(v == "canary" for _, v in got) / len(got)
    assert 0.15 < share < 0.45, share
    sticky = send(router, 30, key=lambda i: "customer-7")
    assert len({v for _, v in sticky}) == 1
    # Validation errors pass through from the server, and are not retried or counted as canary errors.
    assert httpx.post(f"{router}/v1/predict", json={"text": ""}, headers=H).status_code == 422
    metrics = httpx.get(f"{router}/metrics").text
    assert 'intentops_router_requests_total{role="primary",status="200",variant="canary"}' in metrics
    assert 'intentops_router_weight{variant="canary"} 0.3' in metrics


def test_failed_canary_requests_are_retried_on_stable(router, servers):
    routes(router, canary=servers["flaky"], weight=0.5)
    t0 = time.time()
    got = send(router, 200)
    assert {s for s, _ in got} == {200}  # clients never see the canary's failures
    stats = httpx.get(f"{router}/admin/stats", params={"since": t0}, headers=A).json()
    assert stats["fallbacks"] > 10 and stats["canary"]["errors"] == stats["fallbacks"]
    assert 0.3 < stats["canary"]["error_rate"] < 0.7
    # A canary that is down entirely: still no client failure.
    routes(router, canary=f"http://127.0.0.1:{_free_port()}", weight=1.0)
    assert {s for s, _ in send(router, 20)} == {200}


def test_shadow_mirrors_without_touching_the_answer(router, servers):
    routes(router, canary=servers["slow"], weight=0.0, shadow=1.0)
    t0 = time.time()
    got = send(router, 60)
    assert {v for _, v in got} == {"stable"} and {s for s, _ in got} == {200}
    # Mirrored calls finish after the clients have their answers: wait for them (a fixed
    # sleep was too short on a loaded machine).
    deadline = time.time() + 30
    while True:
        stats = httpx.get(f"{router}/admin/stats", params={"since": t0}, headers=A).json()
        if stats["shadow"]["compared"] >= 30 or time.time() > deadline:
            break
        time.sleep(0.5)
    assert stats["shadow"]["compared"] >= 30 and stats["shadow"]["agreement"] >= 0.9
    assert stats["canary"]["served"] == 0 and stats["canary"]["requests"] >= 30
    # The slow canary's latency never reached the clients: stable's typical answer stays
    # below the canary's injected delay (the median: a p99 of 60 calls is one outlier).
    assert stats["stable"]["p50_ms"] < stats["canary"]["p50_ms"]


def test_overload_is_shed_with_503(servers, project_env):
    proc, url = start_router(servers["slow"], project_env, "--max-inflight", "2")
    try:
        got = send(url, 120, workers=16)  # 16 clients, a 50 ms server, room for 2 in flight
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    codes = [s for s, _ in got]
    assert 503 in codes and 200 in codes and set(codes) <= {200, 503}


def test_routes_only_to_allowed_upstreams_and_refuses_bad_keys_and_big_bodies(router, servers):
    """An admin key cannot point client traffic (and the upstream key) at another host;
    a non-ASCII key is 401 and an oversized body 413, as on the model server."""
    from deploy.router import upstream_allowed

    loopback = ("http://127.0.0.1:", "http://localhost:")
    assert upstream_allowed("http://127.0.0.1:8101", loopback)
    for bad in ("http://10.0.0.7:8101", "http://127.0.0.1.evil.example:80", "file:///etc/passwd",
                "http://user:pw@127.0.0.1:8101", "http://127.0.0.1", "http://127.0.0.1:notaport"):
        assert not upstream_allowed(bad, loopback), bad
    r = httpx.put(f"{router}/admin/routes", json={"canary": "http://10.0.0.7:8101", "weight": 0.5}, headers=A)
    assert r.status_code == 422 and "allow-list" in r.text
    assert httpx.get(f"{router}/admin/routes", headers=A).json()["canary"] is None
    r = httpx.post(f"{router}/v1/predict", json={"text": "hi"}, headers={"Authorization": "Bearer clé".encode()})
    assert r.status_code == 401
    r = httpx.put(f"{router}/admin/routes", json={"weight": 0.1}, headers={"Authorization": b"Bearer \xff"})
    assert r.status_code == 401
    big = b'{"text": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    r = httpx.post(f"{router}/v1/predict", content=big, headers={**H, "content-type": "application/json"})
    assert r.status_code == 413


def test_client_keys_are_managed_by_the_admin_role_only_and_audited(servers, project_env, tmp_path, audit_log):
    import json

    from deploy.server import key_actor

    keys_file = tmp_path / "client_keys"
    keys_file.write_text(f"{CLIENT}\n")
    keys_file.chmod(0o600)
    key_admin = "key-admin-key"
    env = dict(project_env, INTENTOPS_API_KEYS_FILE=str(keys_file), INTENTOPS_KEY_ADMIN_KEYS=key_admin)
    port = _free_port()
    env = dict(env, INTENTOPS_UPSTREAM_KEY=INTERNAL, INTENTOPS_ADMIN_KEYS=ADMIN)
    env.pop("INTENTOPS_API_KEYS", None)
    proc = subprocess.Popen([sys.executable, "-m", "deploy.router", "--stable", servers["stable"],
                             "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    K = {"Authorization": f"Bearer {key_admin}"}
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        # Roles: a client or operator key may not manage keys (403), an unknown key is 401,
        # and the admin key is not an operator key (routes stay the operator's).
        assert httpx.get(f"{url}/admin/keys", headers=H).status_code == 403
        assert httpx.post(f"{url}/admin/keys", headers=A).status_code == 403
        assert httpx.get(f"{url}/admin/keys", headers={"Authorization": "Bearer nobody"}).status_code == 401
        assert httpx.put(f"{url}/admin/routes", json={"weight": 0}, headers=K).status_code == 403
        listed = httpx.get(f"{url}/admin/keys", headers=K).json()
        assert listed["keys"] == [{"fingerprint": key_actor(CLIENT).removeprefix("key:"), "role": "client"}]
        assert CLIENT not in json.dumps(listed)

        made = httpx.post(f"{url}/admin/keys", headers=K)
        assert made.status_code == 201 and made.json()["persisted_to_file"] is True
        new = made.json()["key"]
        # The new key works at once, and is in the file (mode 0600) for the next start.
        assert httpx.post(f"{url}/v1/predict", json={"text": "card not working"},
                          headers={"Authorization": f"Bearer {new}"}).status_code == 200
        assert keys_file.read_text().split() == [CLIENT, new]
        assert oct(keys_file.stat().st_mode & 0o777) == "0o600"

        old_fp = key_actor(CLIENT).removeprefix("key:")
        assert httpx.delete(f"{url}/admin/keys/{old_fp}", headers=H).status_code == 403
        assert httpx.delete(f"{url}/admin/keys/000000000000", headers=K).status_code == 404
        r = httpx.delete(f"{url}/admin/keys/{old_fp}", headers=K)
        assert r.status_code == 200 and r.json()["remaining"] == 1
        assert httpx.post(f"{url}/v1/predict", json={"text": "card not working"}, headers=H).status_code == 401
        assert keys_file.read_text().split() == [new]
        # The last key cannot go: the router would otherwise have no client at all.
        new_fp = made.json()["fingerprint"]
        assert httpx.delete(f"{url}/admin/keys/{new_fp}", headers=K).status_code == 409

        records = [json.loads(line) for line in audit_log.read_text().splitlines()]
        mine = [r for r in records if r["action"].startswith("keys.") and r["actor"] == key_actor(key_admin)]
        assert [(r["action"], r["outcome"]) for r in mine[-3:]] == [
            ("keys.create", "done"), ("keys.revoke", "done"), ("keys.revoke", "refused")]
        assert all(r["role"] == "admin" for r in mine) and new not in audit_log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
