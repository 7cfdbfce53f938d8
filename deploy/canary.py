"""The canary controller: roll a challenger's int8 build out beside the stable model.

``rollout`` starts the canary server, steps its traffic share through ``deploy.steps``
with at least ``bake_seconds`` per step while a load generator sends held-out labeled
messages through the router, and at every poll compares canary with stable:

* error rate of the canary's calls (5xx, timeouts, refused connections) in this step;
* p50 and p99 latency of the canary in this step against stable's over the rollout so far;
* agreement of the canary's labels with stable's on mirrored (shadow) traffic;
* accuracy on the labeled probe traffic, canary against stable.

A limit counts as broken when a 99% Wilson interval of the canary's proportion lies past
it (``wilson``), so small samples do not roll back a good model. A broken limit aborts at once: canary weight 0, canary stopped,
aliases untouched, the reason tagged on the version. All steps passed promotes: the
canary becomes the stable server, the alias ``champion`` moves to it and the old
champion becomes ``previous`` (``intentops deploy rollback`` goes back in one command).
With no stable model yet the first deployment is a plain rollout: all traffic to the new
server for one bake, with the same error and latency checks against absolute limits and
accuracy against the version's recorded test accuracy.

This is the analysis Flagger or Argo Rollouts run against Prometheus on Kubernetes; the
steps, limits and decision tags map one to one onto their Canary/AnalysisTemplate.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from core import audit, tracking
from core.config import PipelineConfig
from deploy.deployment import (
    ALIAS_CHALLENGER,
    ALIAS_CHAMPION,
    ALIAS_PREVIOUS,
    DECISION_TAG,
    REASON_TAG,
    DeployError,
    Deployment,
)
from textnorm import normalize_label

log = logging.getLogger(__name__)


class LoadGenerator:
    """Closed-loop clients sending one labeled message per request through the router,
    in a background thread. Records ``(time, variant, status, correct, truth_oos, said_oos)``
    per request: a probe whose label is ``oos_label`` is correct when answered out of scope,
    any other when answered in scope with its label (an in-scope probe the reject rule
    turns away counts as wrong)."""

    def __init__(self, url: str, key: str, texts: list[str], labels: list[str], concurrency: int,
                 seed: int = 0, oos_label: str | None = None) -> None:
        if not texts:
            raise DeployError("no probe messages for the load generator")
        self.url, self.key, self.texts, self.labels = url, key, texts, labels
        self.oos_label = oos_label
        self.concurrency = concurrency
        self.records: list[tuple[float, str, int, bool | None, bool, bool | None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rnd = random.Random(seed)

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True,
                                        name="intentops-loadgen")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(base_url=self.url, timeout=30, limits=limits,
                                     headers={"Authorization": f"Bearer {self.key}"}) as client:
            async def worker() -> None:
                while not self._stop.is_set():
                    i = self._rnd.randrange(len(self.texts))
                    truth_oos = self.oos_label is not None and self.labels[i] == self.oos_label
                    said_oos: bool | None = None
                    correct: bool | None = None
                    try:
                        r = await client.post("/v1/predict", json={"text": self.texts[i]})
                        variant, status = r.headers.get("x-variant", "?"), r.status_code
                        if status == 200:
                            a = r.json()["predictions"][0]
                            said_oos = bool(a.get("oos"))
                            correct = said_oos if truth_oos else (not said_oos and a["label"] == self.labels[i])
                    except httpx.HTTPError:
                        variant, status = "?", 0
                    self.records.append((time.time(), variant, status, correct, truth_oos, said_oos))
                    if status != 200:
                        await asyncio.sleep(0.05)

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    def summary(self, since: float = 0.0) -> dict[str, Any]:
        recs = [r for r in list(self.records) if r[0] >= since]
        out: dict[str, Any] = {"requests": len(recs), "failed": sum(1 for r in recs if r[2] != 200)}
        for v in ("stable", "canary"):
            mine = [r for r in recs if r[1] == v and r[3] is not None]
            judged = [r[3] for r in mine if not r[4]]
            oos = [r[3] for r in mine if r[4]]
            said = [r[4] for r in mine if r[5]]
            out[v] = {"probes": len(judged), "correct": sum(judged),
                      "accuracy": sum(judged) / len(judged) if judged else None,
                      "oos_probes": len(oos), "oos_hits": sum(oos),
                      "oos_recall": sum(oos) / len(oos) if oos else None,
                      "oos_precision": sum(said) / len(said) if said and self.oos_label else None}
        return out


P99_SAMPLES = 100
Z = 2.576  # two-sided 99%: a limit counts as broken only when the evidence says so


def wilson(k: int, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n. Short steps see few requests: 29 of 31
    probes right is 93.5%, but a 99% interval reaches 98.5%, so a model as good as stable
    is not rolled back on noise, while a wrong one (12.5%) is caught at once."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Analysis:
    failures: list[str] = field(default_factory=list)
    enough: bool = False
    point: dict[str, Any] = field(default_factory=dict)


def analyse(cfg: PipelineConfig, step_stats: dict, total_stats: dict, load_total: dict,
            has_stable: bool, baseline_accuracy: float | None,
            baseline_oos_recall: float | None = None) -> Analysis:
    """Compare canary and stable; ``enough`` once the canary had ``min_requests`` calls
    in this step. Failures are only judged on enough evidence."""
    d = cfg.deploy
    c, s_all = step_stats["canary"], total_stats["stable"]
    a = Analysis(enough=c["requests"] >= d.min_requests)
    if c["requests"] >= d.min_requests and wilson(c["errors"], c["requests"])[0] > d.max_error_rate:
        a.failures.append(f"canary error rate {c['error_rate']:.1%} > {d.max_error_rate:.1%} "
                          f"({c['errors']} of {c['requests']} calls)")
    # Latency: the median on min_requests answers (a slow canary shows at once), the p99
    # only on P99_SAMPLES (with fewer it is the single slowest request, mostly noise).
    for q, need in (("p50", d.min_requests), ("p99", P99_SAMPLES)):
        mine = c[f"{q}_ms"]
        if mine is None or c["ok"] < need:
            continue
        ref_ms = s_all[f"{q}_ms"] if has_stable else None
        if ref_ms is not None:
            limit = d.max_latency_ratio * ref_ms + d.latency_slack_ms
            what = f"{d.max_latency_ratio:g} x stable {q} {ref_ms:.1f} ms + {d.latency_slack_ms:g} ms"
        elif q == "p99":
            limit, what = d.max_p99_ms, "the absolute limit"
        else:
            continue
        if mine > limit:
            a.failures.append(f"canary {q} {mine:.1f} ms > {limit:.1f} ms ({what}, {c['ok']} answers)")
    sh = total_stats["shadow"]
    if (has_stable and sh["compared"] >= d.min_compared
            and wilson(sh["agreed"], sh["compared"])[1] < d.min_agreement):
        a.failures.append(f"canary agrees with stable on {sh['agreement']:.1%} of {sh['compared']} mirrored "
                          f"messages < {d.min_agreement:.0%}")
    ca, sa = load_total["canary"], load_total["stable"]
    ref = sa["accuracy"] if has_stable and sa["probes"] >= d.min_probes else (
        None if has_stable else baseline_accuracy)
    if (ca["probes"] >= d.min_probes and ref is not None
            and wilson(ca["correct"], ca["probes"])[1] < ref - d.max_accuracy_drop):
        a.failures.append(f"canary in-scope accuracy {ca['accuracy']:.1%} on {ca['probes']} labeled probes < "
                          f"{'stable' if has_stable else 'recorded test'} {ref:.1%} - {d.max_accuracy_drop:.0%}")
    # Out-of-scope recall, when the probes hold out-of-scope messages: the canary may not
    # lose more than oos.max_recall_drop against stable (or its recorded test figure).
    ref_oos = sa["oos_recall"] if has_stable and sa["oos_probes"] >= d.min_probes else (
        None if has_stable else baseline_oos_recall)
    drop = cfg.oos.max_recall_drop
    if (ca["oos_probes"] >= d.min_probes and ref_oos is not None
            and wilson(ca["oos_hits"], ca["oos_probes"])[1] < ref_oos - drop):
        a.failures.append(f"canary out-of-scope recall {ca['oos_recall']:.1%} on {ca['oos_probes']} probes < "
                          f"{'stable' if has_stable else 'recorded test'} {ref_oos:.1%} - {drop:.0%}")
    a.point = {"canary_error_rate": c["error_rate"], "canary_p99_ms": c["p99_ms"], "canary_p50_ms": c["p50_ms"],
               "stable_p99_ms": step_stats["stable"]["p99_ms"], "agreement": sh["agreement"],
               "canary_accuracy": ca["accuracy"], "stable_accuracy": sa["accuracy"],
               "canary_oos_recall": ca["oos_recall"], "stable_oos_recall": sa["oos_recall"],
               "canary_requests": c["requests"], "fallbacks": step_stats["fallbacks"]}
    return a


def plot(timeline: list[dict[str, Any]], decision: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [p["t"] for p in timeline]
    fig, ax = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    ax[0].step(t, [100 * p["weight"] for p in timeline], where="post", color="black")
    ax[0].set_ylabel("canary traffic %")
    ax[0].set_title(f"canary rollout: {decision}")
    for key, lab in (("canary_p99_ms", "canary"), ("stable_p99_ms", "stable")):
        ax[1].plot(t, [p.get(key) if p.get(key) is not None else float("nan") for p in timeline], label=lab)
    ax[1].set_ylabel("p99 ms")
    ax[1].legend()
    ax[2].plot(t, [100 * p["canary_error_rate"] for p in timeline], color="tab:red")
    ax[2].set_ylabel("canary errors %")
    for key, lab in (("agreement", "agreement (shadow)"), ("canary_accuracy", "canary accuracy"),
                     ("stable_accuracy", "stable accuracy")):
        ax[3].plot(t, [100 * p[key] if p.get(key) is not None else float("nan") for p in timeline], label=lab)
    ax[3].set_ylabel("%")
    ax[3].set_xlabel("seconds since rollout start")
    ax[3].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _baseline(client, name: str, version: str) -> tuple[float | None, float | None]:
    """The version's recorded test figures: in-scope accuracy under its reject rule (plain
    accuracy for a model trained before the rule), and out-of-scope recall."""
    mv = client.get_model_version(name, version)
    try:
        m = client.get_run(mv.run_id).data.metrics
    except Exception:
        return None, None
    return m.get("test_in_scope_accuracy", m.get("test_accuracy")), m.get("test_oos_recall")


def _record(client, name: str, version: str, decision: str, reason: str) -> None:
    client.set_model_version_tag(name, version, DECISION_TAG, decision)
    client.set_model_version_tag(name, version, REASON_TAG, reason[:500])


def rollout(cfg: PipelineConfig, version: str, texts: list[str], labels: list[str], out: Path,
            server_args: list[str] | None = None) -> dict[str, Any]:
    """Roll ``version`` out; returns the decision (``promoted``, ``rolled_back``,
    ``refused`` or ``already_serving``) with its reason, timeline and counts.
    ``server_args`` go to the canary's server (fault injection in drills and tests)."""
    d = cfg.deploy
    name = cfg.training.registered_model
    client = tracking.mlflow_client(cfg)
    dep = Deployment(cfg)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"version": str(version), "registered_model": name}
    try:
        build = dep.fetch_build(name, version)
    except DeployError as exc:
        _record(client, name, version, "refused", str(exc))
        return result | {"decision": "refused", "reason": str(exc)}
    state = dep.state()
    dep.ensure_router(state)
    stable = dep.ensure_stable(state, name)
    if stable and stable["version"] == str(version):
        dep.routes(state, stable=dep.stable_pool(state))
        return result | {"decision": "already_serving", "reason": f"v{version} is the stable model already"}
    result["stable_version"] = stable["version"] if stable else None
    if dep.alive(state.get("canary")):
        # The canary of a rollout an error or a killed task interrupted (the deploy task's
        # retry lands here): stopped, not left running beside the new one.
        log.warning("stopping the canary v%s a previous rollout left", state["canary"].get("version"))
        dep.kill(state["canary"])
        state["canary"] = None
        dep.save(state)
    timeline: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        canary = dep.start_server(build, version, "canary", server_args)
    except DeployError as exc:
        reason = f"canary never became ready: {exc}"
        _record(client, name, version, "rolled_back", reason)
        return result | {"decision": "rolled_back", "reason": reason, "timeline": []}
    state["canary"] = canary
    dep.save(state)
    has_stable = stable is not None
    steps = d.steps if has_stable else [100]
    dep.routes(state, canary=canary["url"], weight=0.0, shadow=d.shadow_share if has_stable else 0.0)
    oos_label = normalize_label(cfg.oos.label) if cfg.oos.label else None
    load = LoadGenerator(state["router"]["url"], dep.client_key(), texts, labels, d.load_concurrency,
                         oos_label=oos_label)
    baseline, baseline_oos = (None, None) if has_stable else _baseline(client, name, version)
    load.start()
    decision, reason, done = "rolled_back", "", 0
    try:
        for step in steps:
            dep.routes(state, weight=step / 100)
            start = time.time()
            events.append({"t": start - t0, "event": f"weight {step}%"})
            log.info("canary v%s at %d%% of traffic", version, step)
            verdict: Analysis | None = None
            while True:
                time.sleep(d.poll_seconds)
                if has_stable and not dep.alive(state["stable"]):
                    events.append({"t": time.time() - t0, "event": "stable died; restarted"})
                    stable = dep.ensure_stable(state, name)
                if not dep.alive(canary):
                    raise DeployError(f"the canary server exited during the rollout; log: {canary['log']}")
                verdict = analyse(cfg, dep.router_stats(state, start), dep.router_stats(state, t0),
                                  load.summary(t0), has_stable, baseline, baseline_oos)
                timeline.append({"t": time.time() - t0, "weight": step / 100, **verdict.point})
                elapsed = time.time() - start
                if verdict.failures and verdict.enough:
                    raise DeployError(f"at {step}% traffic: " + "; ".join(verdict.failures))
                if elapsed >= d.bake_seconds and verdict.enough and not verdict.failures:
                    break
                if elapsed >= 3 * d.bake_seconds:
                    raise DeployError(f"at {step}% traffic: only {verdict.point['canary_requests']} canary calls in "
                                      f"{elapsed:.0f} s, fewer than min_requests {d.min_requests}; no verdict")
            done += 1
        decision = "promoted"
        reason = (f"every check passed at {', '.join(f'{s}%' for s in steps)}"
                  + (f" against stable v{stable['version']}" if has_stable else " (first deployment)"))
    except (DeployError, httpx.HTTPError) as exc:
        reason = str(exc)
    finally:
        load.stop()
    summary = load.summary(t0)
    stats = dep.router_stats(state, t0)
    if decision == "promoted":
        _promote(dep, state, canary, client, name, str(version))
    else:
        dep.routes(state, canary="", weight=0.0, shadow=0.0)
        dep.kill(canary)
        state["canary"] = None
        dep.save(state)
        log.warning("canary v%s rolled back: %s", version, reason)
    _record(client, name, version, decision, reason)
    audit.record("rollout", f"{name} v{version}", decision, reason)
    events.append({"t": time.time() - t0, "event": decision})
    result |= {"decision": decision, "reason": reason, "steps_passed": done, "steps": steps,
               "client_requests": summary["requests"], "client_failures": summary["failed"],
               "fallbacks": stats["fallbacks"], "shadow": stats["shadow"],
               "accuracy": {v: summary[v]["accuracy"] for v in ("stable", "canary")},
               "oos_recall": {v: summary[v]["oos_recall"] for v in ("stable", "canary")},
               "oos_precision": {v: summary[v]["oos_precision"] for v in ("stable", "canary")},
               "p99_ms": {v: stats[v]["p99_ms"] for v in ("stable", "canary")},
               "error_rate": {v: stats[v]["error_rate"] for v in ("stable", "canary")},
               "seconds": round(time.time() - t0, 1)}
    (out / "rollout.json").write_text(json.dumps(result | {"timeline": timeline, "events": events}, indent=2))
    if timeline:
        plot(timeline, decision, out / "rollout.png")
    _log_artifacts(client, name, str(version), out)
    return result | {"timeline": timeline, "events": events}


def _promote(dep: Deployment, state: dict[str, Any], canary: dict[str, Any], client, name: str,
             version: str) -> None:
    old = state.get("stable")
    dep.routes(state, stable=canary["url"], canary="", weight=0.0, shadow=0.0)
    state["stable"], state["canary"] = canary | {"role": "stable"}, None
    dep.save(state)
    dep.kill(old)  # SIGTERM: uvicorn finishes the requests it still has
    aliases = dep.aliases()
    champ = aliases.get(ALIAS_CHAMPION)
    why = f"canary of v{version} passed every step: promoted"
    if champ and champ != version:
        tracking.move_alias(client, name, ALIAS_PREVIOUS, champ, why)
    tracking.move_alias(client, name, ALIAS_CHAMPION, version, why)
    from core import pushmetrics

    pushmetrics.champion_promoted(name, version)  # for the champion-age alert
    if aliases.get(ALIAS_CHALLENGER) == version:
        tracking.move_alias(client, name, ALIAS_CHALLENGER, None, why)
    log.info("promoted v%s: champion -> v%s, previous -> v%s", version, version, champ)


def _log_artifacts(client, name: str, version: str, out: Path) -> None:
    run_id = client.get_model_version(name, version).run_id
    for f in ("rollout.json", "rollout.png"):
        if (out / f).exists():
            client.log_artifact(run_id, str(out / f), artifact_path=f"deploy/v{version}")
