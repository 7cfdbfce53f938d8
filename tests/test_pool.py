"""Replica pools, the response cache and the autoscaling policy, without processes (the
same code runs in real processes in test_scaling.py)."""

from __future__ import annotations

import json
import random
import time

import pytest

from core.config import AutoscaleConfig
from deploy.autoscaler import Memory, Signals, decide
from deploy.cache import ResponseCache
from deploy.pool import Pools


def test_least_outstanding_replica_is_picked_and_ties_are_spread():
    p = Pools(rnd=random.Random(1))
    p.set("stable", ["a", "b", "c"])
    a, b, c = p.members["stable"]
    p.started(a)
    p.started(a)
    p.started(b)
    assert p.pick("stable") is c
    p.started(c)
    assert p.pick("stable") in (b, c)
    assert p.pick("stable", exclude={"b", "c"}) is a
    counts = {"a": 0, "b": 0, "c": 0}
    q = Pools(rnd=random.Random(2))
    q.set("stable", ["a", "b", "c"])
    for _ in range(300):
        counts[q.pick("stable").url] += 1
    assert all(v > 60 for v in counts.values()), counts  # ties at zero: spread at random


def test_failing_replica_is_ejected_and_a_health_check_readmits_it():
    p = Pools(eject_after=2, eject_seconds=60)
    p.set("stable", ["a", "b"])
    a, b = p.members["stable"]
    p.started(a)
    p.finished(a, 503)  # one overload answer: still usable
    assert a.usable(time.time())
    p.started(a)
    p.finished(a, 503)  # two in a row: ejected
    assert not a.usable(time.time()) and p.pick("stable") is b
    p.started(b)
    p.finished(b, 0)  # no answer at all: ejected at once
    assert p.pick("stable") is None and p.usable_count("stable") == 0
    p.checked(a, True, "7")  # ready again
    assert p.pick("stable") is a and a.version == "7" and a.failures == 0
    p.checked(b, False, None)
    assert not b.healthy


def test_removed_replicas_drain_and_a_promoted_one_does_not():
    p = Pools()
    p.set("stable", ["s1", "s2"])
    p.set("canary", ["c1"])
    s2 = p.members["stable"][1]
    p.started(s2)
    assert p.set("stable", ["s1"]) == ["s2"]
    assert [r.url for r in p.draining] == ["s2"] and p.pick("stable").url == "s1"
    p.finished(s2, 200)
    assert p.draining == []  # its last request is done: gone
    # A promotion: the canary's replica becomes stable without draining; the old stable
    # drains while it has a request, an idle one goes at once.
    p.started(p.members["stable"][0])
    p.set("stable", ["c1"])
    assert p.set("canary", []) == [] and [r.url for r in p.draining] == ["s1"]
    view = p.view()
    assert [r["url"] for r in view["stable"]] == ["c1"] and view["canary"] == []


def _answer(version: str) -> bytes:
    return json.dumps({"model_version": version, "predictions": [{"label": "card_arrival", "score": 0.9}]}).encode()


@pytest.fixture(scope="module")
def spec():
    from contract import preprocess

    return preprocess.spec("placeholder", None)


def test_cache_keys_masked_text_per_variant_and_version(spec):
    c = ResponseCache(size=2)
    c.configure("stable", "1", spec)
    k1 = c.key("stable", "my card from Sarah Jones has not arrived")
    k2 = c.key("stable", "my card from John Smith has not arrived")
    assert k1 == k2  # the same message once the names are masked: one entry, one answer
    assert "Sarah" not in k1 and "card" not in k1 and k1.startswith("1:")
    c.put("stable", k1, _answer("1"))
    assert c.get("stable", k2) == _answer("1")
    assert c.key("canary", "my card") is None  # the canary has reported nothing: not cached
    c.configure("canary", "2", spec)
    assert c.get("canary", c.key("canary", "my card from Sarah Jones has not arrived")) is None
    # An answer from another version is not stored under this version's key.
    k3 = c.key("stable", "top up failed")
    c.put("stable", k3, _answer("2"))
    assert c.get("stable", k3) is None
    # Bounded LRU.
    for i in range(5):
        c.put("stable", c.key("stable", f"question {i}"), _answer("1"))
    assert len(c.entries["stable"]) == 2
    # A new version empties the variant's entries, not the other variant's.
    c.put("canary", c.key("canary", "x"), _answer("2"))
    c.configure("stable", "3", spec)
    assert len(c.entries["stable"]) == 0 and len(c.entries["canary"]) == 1


def test_cache_is_off_for_a_preprocessing_it_cannot_reproduce(spec):
    c = ResponseCache(size=10)
    c.configure("stable", "1", {**spec, "version": "not-this-code"})
    assert c.preprocess["stable"] is None and "preprocessing version" in c.off_reason["stable"]
    assert c.key("stable", "hello") is None
    off = ResponseCache(size=0)
    off.configure("stable", "1", spec)
    assert not off.enabled and off.preprocess["stable"] is None


def test_autoscaling_policy_scales_up_with_cooldown_and_down_after_calm():
    pol = AutoscaleConfig(min_replicas=1, max_replicas=3, target_outstanding=4, low_outstanding=1,
                          max_p99_ms=100, max_cpu=0.9, up_cooldown_seconds=10, down_cooldown_seconds=30,
                          down_after_seconds=20)
    mem = Memory()
    hot = Signals(replicas=1, outstanding=12, p99_ms=80, cpu=0.5)
    want, why = decide(hot, 1, pol, mem, now=0)
    assert want == 2 and "outstanding 12.0/replica > 4" in why
    mem.last_up = 0
    assert decide(Signals(2, 20, 80, 0.5), 2, pol, mem, now=5)[0] == 2  # cooling down
    assert decide(Signals(2, 4, 250, 0.5), 2, pol, mem, now=11)[0] == 3  # p99 alone
    mem.last_up = 11
    assert decide(Signals(3, 40, 250, 1.0), 3, pol, mem, now=30) == (3, "hot at the maximum: outstanding "
                                                                       "13.3/replica > 4; p99 250 ms > 100; "
                                                                       "cpu 1.00 > 0.9")
    calm = Signals(replicas=3, outstanding=0, p99_ms=20, cpu=0.1)
    assert decide(calm, 3, pol, mem, now=40)[0] == 3  # calm just started
    assert decide(calm, 3, pol, mem, now=55)[0] == 3  # calm 15 s < 20 s
    want, why = decide(calm, 3, pol, mem, now=61)
    assert want == 2 and why.startswith("calm for 21 s")
    mem.last_down = 61
    assert decide(calm, 2, pol, mem, now=70)[0] == 2  # cooling down after the scale-in
    assert decide(calm, 2, pol, mem, now=92)[0] == 1
    assert decide(calm, 1, pol, mem, now=200)[0] == 1  # never below the minimum
    # Out of bounds either way is fixed first (a replica died; the config changed).
    assert decide(calm, 0, pol, Memory(), now=0)[0] == 1
    assert decide(hot, 5, pol, Memory(), now=0)[0] == 3
    # A blip of load resets the calm clock.
    m2 = Memory()
    decide(calm, 2, pol, m2, now=0)
    decide(Signals(2, 3, 20, 0.1), 2, pol, m2, now=15)
    assert decide(calm, 2, pol, m2, now=25)[0] == 2
