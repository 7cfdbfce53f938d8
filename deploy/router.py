"""The router: one endpoint for clients in front of the stable and the canary model server.

    python -m deploy.router --stable http://127.0.0.1:8101 [--canary URL --weight 0.1
        --shadow 0.2] [--host 127.0.0.1] [--port 8200]

* ``POST /v1/predict`` is forwarded to ``stable`` or ``canary``: a weighted random split,
  or, when the request carries ``X-Routing-Key``, a sticky one (a hash of the key against
  the weight, so one customer stays on one variant while the weight holds, and moves only
  one way as it grows). The answer carries ``X-Variant: stable|canary``.
* A canary answer of 5xx, a timeout or a refused connection is retried on stable, so
  clients never see the canary's failures; the failure still counts against the canary.
* ``POST /v1/feedback`` (the true label of a prediction, ``deploy.predlog``) is forwarded
  to a stable replica (the canary's when there is no stable): the replicas share one
  prediction log, so any of them finds a prediction whichever variant answered it. Client
  and operator keys may send it.
* Shadow mode mirrors a share of the stable-served requests to the canary after the
  client has its answer; the canary's answer is dropped, and only whether it agreed with
  stable's labels is kept.
* Per-variant metrics at ``/metrics`` (Prometheus) and, for the canary controller, a
  windowed summary at ``GET /admin/stats?since=<unix time>``: requests, errors, p50/p99
  latency per variant, fallbacks, and shadow agreement.
* ``PUT /admin/routes`` changes the upstreams and weights at run time (operator key).
* Client keys as the model server takes them (``INTENTOPS_API_KEYS`` or
  ``INTENTOPS_API_KEYS_FILE``); the router calls the servers with
  ``INTENTOPS_UPSTREAM_KEY``; routes and stats need an operator key
  (``INTENTOPS_ADMIN_KEYS``).
* Key management is the admin role's (``INTENTOPS_KEY_ADMIN_KEYS``), and only its:
  ``GET /admin/keys`` lists the client keys by fingerprint, ``POST /admin/keys`` makes a
  new client key (shown once), ``DELETE /admin/keys/<fingerprint>`` revokes one (never the
  last). Changes take effect at once and, when the keys came from
  ``INTENTOPS_API_KEYS_FILE``, are written back to that file (mode 0600, atomically); each
  is an audit record (``keys.create``, ``keys.revoke``).
* More requests in flight than ``--max-inflight`` are shed with 503 and Retry-After.

Written by hand: the traffic split, sticky hashing and the retry are what Envoy or an
Argo Rollouts/Flagger mesh would do, but those need a proxy binary or Kubernetes that
this one-machine shape does not have; the logic is small, and the stats the canary
analysis needs (agreement of mirrored answers) are not something a generic proxy reports.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from core.secretfiles import write_private
from deploy.cache import ResponseCache
from deploy.pool import RETRY_STATUSES, VARIANTS, Pools, Replica
from deploy.server import BodyLimit, key_actor, key_matches, load_api_keys, presented_key, role_of

log = logging.getLogger("intentops.router")
ROUTING_KEY = "x-routing-key"


@dataclass
class Routes:
    stable: str | None = None  # the first stable replica (None: no stable variant)
    canary: str | None = None
    weight: float = 0.0  # share of client requests sent to the canary
    shadow: float = 0.0  # share of stable-served requests mirrored to the canary
    stable_replicas: list[str] = field(default_factory=list)  # every replica, ``stable`` first
    canary_replicas: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.stable and not self.stable_replicas:
            self.stable_replicas = [self.stable]
        if self.canary and not self.canary_replicas:
            self.canary_replicas = [self.canary]

    def replicas(self, variant: str) -> list[str]:
        return self.stable_replicas if variant == "stable" else self.canary_replicas


def _urls(value: str | list[str]) -> list[str]:
    return [u for u in ([value] if isinstance(value, str) else value) if u]


class RoutesUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stable: str | list[str] | None = Field(
        None, description="stable replica URL or URLs (unchanged when absent; removed replicas drain)")
    canary: str | list[str] | None = Field(None, description="canary replica URL(s); empty removes the canary")
    weight: float | None = Field(None, ge=0.0, le=1.0)
    shadow: float | None = Field(None, ge=0.0, le=1.0)


@dataclass
class RouterConfig:
    api_keys: list[str] = field(default_factory=list)
    admin_keys: list[str] = field(default_factory=list)  # role operator: routes, stats
    key_admin_keys: list[str] = field(default_factory=list)  # role admin: client keys
    keys_file: Path | None = None  # where client keys persist (INTENTOPS_API_KEYS_FILE)
    upstream_key: str = ""
    timeout_s: float = 10.0
    max_inflight: int = 512
    max_shadow_inflight: int = 32
    window: int = 50_000  # events kept for /admin/stats
    # Upstreams the routes may name: scheme://host:port prefixes. By default the loopback
    # interface only (the deployment's servers), so an admin key cannot point client
    # traffic, and the upstream key, at another host.
    allowed_upstreams: tuple[str, ...] = ("http://127.0.0.1:", "http://localhost:")
    max_body_bytes: int = 512 * 1024
    health_interval_s: float = 1.0  # active health check of every replica
    eject_after: int = 2  # consecutive failed calls that eject a replica
    eject_seconds: float = 5.0
    cache_size: int = 0  # answers kept per variant (0: no cache)


def upstream_allowed(url: str, allowed: tuple[str, ...]) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return False
    if parts.username or parts.password or parts.query or parts.fragment:
        return False
    base = f"{parts.scheme}://{parts.hostname}:{port}"
    return any(base.startswith(a) if a.endswith(":") else base == a.rstrip("/") for a in allowed)


def sticky_share(key: str) -> float:
    """A stable point in [0, 1) for a routing key."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64


def choose(routes: Routes, key: str | None, rnd: random.Random) -> str:
    if routes.stable is None:
        return "canary"
    if not routes.canary or routes.weight <= 0:
        return "stable"
    if routes.weight >= 1:
        return "canary"
    point = sticky_share(key) if key else rnd.random()
    return "canary" if point < routes.weight else "stable"


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Stats:
    """Recent upstream calls, ``(time, variant, role, status, seconds)``; role is
    ``primary``, ``fallback`` or ``shadow``. Status 0 is a connection error or timeout."""

    def __init__(self, window: int) -> None:
        self.events: collections.deque[tuple[float, str, str, int, float]] = collections.deque(maxlen=window)
        self.agreement: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=window)

    def summary(self, since: float = 0.0) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for variant in ("stable", "canary"):
            ev = [e for e in self.events if e[0] >= since and e[1] == variant]
            served = [e for e in ev if e[2] != "shadow"]
            ok = [e[4] for e in ev if e[3] == 200]
            errors = sum(1 for e in ev if e[3] == 0 or e[3] >= 500)
            out[variant] = {
                "requests": len(ev), "served": len(served), "ok": len(ok), "errors": errors,
                "error_rate": errors / len(ev) if ev else 0.0,
                "p50_ms": None if not ok else 1000 * _percentile(ok, 0.50),
                "p99_ms": None if not ok else 1000 * _percentile(ok, 0.99),
            }
        fb = [e for e in self.events if e[0] >= since and e[2] == "fallback"]
        ag = [a for a in self.agreement if a[0] >= since]
        same, total = sum(a[1] for a in ag), sum(a[2] for a in ag)
        out["fallbacks"] = len(fb)
        out["shadow"] = {"compared": total, "agreed": same, "agreement": same / total if total else None}
        return out


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        # Process memory and CPU, and the limit the memory alert compares them with.
        from prometheus_client import ProcessCollector

        from core.sysinfo import memory_limit_bytes

        ProcessCollector(registry=r)
        Gauge("intentops_memory_limit_bytes", "memory limit of the machine or cgroup",
              registry=r).set(memory_limit_bytes())
        self.requests = Counter("intentops_router_requests_total", "upstream calls by variant, role and status",
                                ["variant", "role", "status"], registry=r)
        self.latency = Histogram("intentops_router_upstream_seconds", "upstream latency by variant",
                                 ["variant"], registry=r,
                                 buckets=(.0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.client = Counter("intentops_router_client_responses_total", "answers to clients by status",
                              ["status"], registry=r)
        self.fallbacks = Counter("intentops_router_fallbacks_total", "canary failures retried on stable",
                                 registry=r)
        self.shadow = Counter("intentops_router_shadow_total", "mirrored requests by outcome",
                              ["outcome"], registry=r)
        self.weight = Gauge("intentops_router_weight", "traffic share by variant", ["variant"], registry=r)
        self.inflight = Gauge("intentops_router_inflight", "client requests in flight", registry=r)
        self.retries = Counter("intentops_router_retries_total",
                               "predictions retried on another replica of the variant", ["variant"], registry=r)
        self.replicas = Gauge("intentops_router_replicas", "replicas by variant and state",
                              ["variant", "state"], registry=r)
        self.outstanding = Gauge("intentops_router_outstanding", "requests outstanding at the variant's replicas",
                                 ["variant"], registry=r)
        self.cache_hits = Counter("intentops_cache_hits_total", "answers from the response cache",
                                  ["variant"], registry=r)
        self.cache_misses = Counter("intentops_cache_misses_total", "cacheable requests the cache did not hold",
                                    ["variant"], registry=r)


class Router:
    def __init__(self, cfg: RouterConfig, routes: Routes) -> None:
        self.cfg = cfg
        self.routes = routes
        self.stats = Stats(cfg.window)
        self.metrics = Metrics()
        self.rnd = random.Random()
        self.inflight = 0
        self.shadow_inflight = 0
        self.client: aiohttp.ClientSession | None = None
        self.pools = Pools(cfg.eject_after, cfg.eject_seconds, self.rnd)
        self.cache = ResponseCache(cfg.cache_size)
        for variant in VARIANTS:
            self.pools.set(variant, routes.replicas(variant))
        self._publish_weights()

    def _publish_weights(self) -> None:
        w = self.routes.weight if self.routes.canary else 0.0
        self.metrics.weight.labels("canary").set(w)
        self.metrics.weight.labels("stable").set(1 - w if self.routes.stable else 0.0)

    def update(self, upd: RoutesUpdate) -> Routes:
        for value in (upd.stable, upd.canary):
            for url in _urls(value or []):
                if not upstream_allowed(url, self.cfg.allowed_upstreams):
                    raise ValueError("upstream not in the router's allow-list (--allow-upstream)")
        r = Routes(**asdict(self.routes))
        if upd.stable is not None:
            r.stable_replicas = _urls(upd.stable)
        if upd.canary is not None:
            r.canary_replicas = _urls(upd.canary)
        r.stable = r.stable_replicas[0] if r.stable_replicas else None
        r.canary = r.canary_replicas[0] if r.canary_replicas else None
        if upd.weight is not None:
            r.weight = upd.weight
        if upd.shadow is not None:
            r.shadow = upd.shadow
        if not r.canary:
            r.weight, r.shadow = 0.0, 0.0
        # Pools first (a promotion moves a replica from canary to stable without draining it),
        # then one reference swap: a request sees the old or the new routes.
        self.pools.set("stable", r.stable_replicas)
        drained = self.pools.set("canary", r.canary_replicas)
        self.routes = r
        self._publish_weights()
        log.info("routes now %s%s", asdict(r), f"; draining {drained}" if drained else "")
        return r

    def publish_pools(self) -> None:
        now = time.time()
        for variant in VARIANTS:
            members = self.pools.members[variant]
            usable = sum(m.usable(now) for m in members)
            self.metrics.replicas.labels(variant, "usable").set(usable)
            self.metrics.replicas.labels(variant, "unusable").set(len(members) - usable)
            self.metrics.outstanding.labels(variant).set(sum(m.outstanding for m in members))
        self.metrics.replicas.labels("any", "draining").set(len(self.pools.draining))

    async def check(self, replica: Replica) -> None:
        """One active health check: ready or not, and the replica's model version."""
        assert self.client is not None
        body: dict[str, Any] = {}
        try:
            async with self.client.get(f"{replica.url}/health/ready",
                                       timeout=aiohttp.ClientTimeout(total=2)) as resp:
                ready = resp.status == 200
                if ready:
                    body = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            ready = False
        was = replica.healthy
        self.pools.checked(replica, ready, body.get("model_version"))
        if was != ready:
            log.warning("replica %s %s", replica.url, "re-admitted" if ready else "ejected: not ready")
        for variant in VARIANTS:
            if replica in self.pools.members[variant] and ready:
                self.cache.configure(variant, body.get("model_version"), body.get("text_preprocessing"))

    async def health_loop(self) -> None:
        while True:
            replicas = self.pools.all()
            if replicas:
                await asyncio.gather(*(self.check(r) for r in replicas), return_exceptions=True)
            self.publish_pools()
            await asyncio.sleep(self.cfg.health_interval_s)

    async def forward(self, variant: str, body: bytes, role: str) -> tuple[int, bytes]:
        """A prediction on the variant's least-loaded usable replica, retried on another
        one when a replica does not answer or answers 502/503/504. Status 0: no replica
        answered (or none is usable)."""
        tried: set[str] = set()
        status, content = 0, b""
        while True:
            replica = self.pools.pick(variant, tried)
            if replica is None:
                return status, content
            if tried:
                self.metrics.retries.labels(variant).inc()
            tried.add(replica.url)
            self.pools.started(replica)
            try:
                status, content = await self.call(variant, replica.url, body, role)
            finally:
                self.pools.finished(replica, status)
            if status not in RETRY_STATUSES:
                return status, content

    async def call(self, variant: str, url: str, body: bytes, role: str) -> tuple[int, bytes]:
        assert self.client is not None
        t0 = time.perf_counter()
        try:
            async with self.client.post(f"{url}/v1/predict", data=body, headers={
                    "content-type": "application/json",
                    "authorization": f"Bearer {self.cfg.upstream_key}"}) as resp:
                status, content = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            status, content = 0, b""
        dt = time.perf_counter() - t0
        self.stats.events.append((time.time(), variant, role, status, dt))
        self.metrics.requests.labels(variant, role, str(status)).inc()
        if status == 200:
            self.metrics.latency.labels(variant).observe(dt)
        return status, content

    async def feedback(self, body: bytes, actor: str) -> tuple[int, bytes]:
        """A feedback on a stable replica (the canary's without one), retried on another
        replica like a prediction; not counted in the prediction stats. Status 0: none answered."""
        assert self.client is not None
        variant = "stable" if self.pools.usable_count("stable") else "canary"
        tried: set[str] = set()
        status, content = 0, b""
        while (replica := self.pools.pick(variant, tried)) is not None:
            tried.add(replica.url)
            self.pools.started(replica)
            try:
                async with self.client.post(f"{replica.url}/v1/feedback", data=body, headers={
                        "content-type": "application/json", "x-intentops-actor": actor,
                        "authorization": f"Bearer {self.cfg.upstream_key}"}) as resp:
                    status, content = resp.status, await resp.read()
            except (aiohttp.ClientError, TimeoutError):
                status, content = 0, b""
            finally:
                self.pools.finished(replica, status)
            if status not in RETRY_STATUSES:
                break
        return status, content

    async def mirror(self, body: bytes, stable_answer: bytes) -> None:
        routes = self.routes
        try:
            if not routes.canary:
                return
            status, content = await self.forward("canary", body, "shadow")
            if status != 200:
                self.metrics.shadow.labels("error").inc()
                return
            a = [p["label"] for p in json.loads(stable_answer)["predictions"]]
            b = [p["label"] for p in json.loads(content)["predictions"]]
            same = sum(x == y for x, y in zip(a, b, strict=False))
            self.stats.agreement.append((time.time(), same, len(a)))
            self.metrics.shadow.labels("agreed" if same == len(a) else "disagreed").inc()
        finally:
            self.shadow_inflight -= 1


def create_app(router: Router) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # aiohttp rather than httpx for the upstream hop: its client costs less CPU per
        # request, and on two shared cores the router's own overhead is the latency budget.
        router.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=router.cfg.timeout_s))
        checker = asyncio.get_running_loop().create_task(router.health_loop())
        yield
        checker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await checker
        await router.client.close()

    app = FastAPI(title="intentops router", version="1", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=router.cfg.max_body_bytes)

    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop per request.
    async def auth(request: Request) -> None:
        if router.cfg.api_keys and not key_matches(presented_key(request), router.cfg.api_keys):
            raise HTTPException(401, "missing or unknown API key", headers={"WWW-Authenticate": "Bearer"})

    def role(given: str) -> str | None:
        return role_of(given, {"admin": router.cfg.key_admin_keys, "operator": router.cfg.admin_keys,
                               "client": router.cfg.api_keys})

    async def admin(request: Request) -> None:
        """/admin/routes and /admin/stats: the operator role (``INTENTOPS_ADMIN_KEYS``).
        Another role's key is 403, an unknown one 401."""
        if not router.cfg.admin_keys:
            raise HTTPException(403, "no operator key configured (INTENTOPS_ADMIN_KEYS)")
        found = role(presented_key(request))
        if found == "operator":
            return
        if found is not None:
            raise HTTPException(403, f"a {found} key may not call this (the operator role may)")
        raise HTTPException(401, "missing or unknown operator key", headers={"WWW-Authenticate": "Bearer"})

    async def key_admin(request: Request) -> None:
        """/admin/keys: the admin role (``INTENTOPS_KEY_ADMIN_KEYS``) only."""
        if not router.cfg.key_admin_keys:
            raise HTTPException(403, "no admin key configured (INTENTOPS_KEY_ADMIN_KEYS)")
        found = role(presented_key(request))
        if found == "admin":
            return
        if found is not None:
            raise HTTPException(403, f"a {found} key may not manage keys (the admin role may)")
        raise HTTPException(401, "missing or unknown admin key", headers={"WWW-Authenticate": "Bearer"})

    def answer(status: int, content: bytes, variant: str, cached: bool = False) -> Response:
        router.metrics.client.labels(str(status)).inc()
        headers = {"X-Variant": variant}
        if router.cache.enabled:
            headers["X-Cache"] = "hit" if cached else "miss"
        return Response(content, status_code=status, media_type="application/json", headers=headers)

    def cacheable(variant: str, body: bytes) -> str | None:
        """The cache key of a single-text request (None: not cached)."""
        if not router.cache.enabled or router.cache.preprocess[variant] is None:
            return None
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        text = doc.get("text") if isinstance(doc, dict) and len(doc) == 1 else None
        if not isinstance(text, str) or not text.strip():
            return None
        try:
            return router.cache.key(variant, text)
        except UnicodeError:
            return None  # the server answers it 422

    @app.post("/v1/predict", dependencies=[Depends(auth)],
              summary="Predict intents (same body and answer as the model server's /v1/predict)")
    async def predict(request: Request) -> Response:
        routes = router.routes
        if routes.stable is None and routes.canary is None:
            return answer(503, b'{"detail": "no model deployed"}', "none")
        if router.inflight >= router.cfg.max_inflight:
            router.metrics.client.labels("503").inc()
            raise HTTPException(503, "overloaded: too many requests in flight", headers={"Retry-After": "1"})
        router.inflight += 1
        router.metrics.inflight.set(router.inflight)
        try:
            body = await request.body()
            variant = choose(routes, request.headers.get(ROUTING_KEY), router.rnd)
            cache_key = cacheable(variant, body)
            if cache_key is not None:
                hit = router.cache.get(variant, cache_key)
                if hit is not None:
                    router.metrics.cache_hits.labels(variant).inc()
                    return answer(200, hit, variant, cached=True)
                router.metrics.cache_misses.labels(variant).inc()
            status, content = await router.forward(variant, body, "primary")
            if variant == "canary" and (status == 0 or status >= 500) and routes.stable:
                router.metrics.fallbacks.inc()
                variant, cache_key = "stable", None
                status, content = await router.forward("stable", body, "fallback")
            if status == 0:
                if not router.pools.usable_count(variant):
                    router.metrics.client.labels("503").inc()
                    raise HTTPException(503, f"no {variant} replica is available", headers={"Retry-After": "1"})
                return answer(502, b'{"detail": "model server unreachable"}', variant)
            if status == 200 and cache_key is not None:
                router.cache.put(variant, cache_key, content)
            if (variant == "stable" and status == 200 and routes.canary and routes.shadow > 0
                    and router.shadow_inflight < router.cfg.max_shadow_inflight
                    and router.rnd.random() < routes.shadow):
                router.shadow_inflight += 1
                asyncio.get_running_loop().create_task(router.mirror(body, content))
            return answer(status, content, variant)
        finally:
            router.inflight -= 1
            router.metrics.inflight.set(router.inflight)

    async def client_or_operator(request: Request) -> None:
        if not router.cfg.api_keys:  # an open router, like /v1/predict
            return
        found = role(presented_key(request))
        if found is None:
            raise HTTPException(401, "missing or unknown API key", headers={"WWW-Authenticate": "Bearer"})
        if found not in ("client", "operator"):
            raise HTTPException(403, f"a {found} key may not send feedback (client and operator keys may)")

    @app.post("/v1/feedback", dependencies=[Depends(client_or_operator)],
              summary="The true label of a prediction (same body and answer as the model server's /v1/feedback)")
    async def feedback(request: Request) -> Response:
        routes = router.routes
        if routes.stable is None and routes.canary is None:
            return answer(503, b'{"detail": "no model deployed"}', "none")
        key = presented_key(request)
        status, content = await router.feedback(await request.body(), key_actor(key) if key else "")
        if status == 0:
            router.metrics.client.labels("503").inc()
            raise HTTPException(503, "no replica is available", headers={"Retry-After": "1"})
        router.metrics.client.labels(str(status)).inc()
        return Response(content, status_code=status, media_type="application/json")

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        if router.routes.stable is None and router.routes.canary is None:
            return JSONResponse({"status": "no model deployed"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/admin/routes", dependencies=[Depends(admin)])
    async def get_routes() -> dict[str, Any]:
        return asdict(router.routes)

    @app.put("/admin/routes", dependencies=[Depends(admin)])
    async def put_routes(upd: RoutesUpdate, request: Request) -> dict[str, Any]:
        from core import audit

        who = key_actor(presented_key(request))
        change = json.dumps(upd.model_dump(exclude_none=True), sort_keys=True)
        try:
            audit.check_writable()
        except audit.AuditError as exc:
            log.error("%s", exc)
            raise HTTPException(503, "routes unchanged: the audit log cannot be written") from None
        try:
            routes = asdict(router.update(upd))
        except ValueError as exc:
            audit.record("router.routes", change, "refused", str(exc), actor_=who, role="operator")
            raise HTTPException(422, str(exc)) from None
        audit.record("router.routes", change, "done", "", actor_=who, role="operator")
        return routes

    @app.get("/admin/pools", dependencies=[Depends(admin)])
    async def pools() -> dict[str, Any]:
        """Replicas by variant (outstanding, health, ejection, version) and draining ones."""
        return router.pools.view() | {"cache": router.cache.view(), "inflight": router.inflight}

    @app.get("/admin/stats", dependencies=[Depends(admin)])
    async def stats(since: float = 0.0) -> dict[str, Any]:
        return router.stats.summary(since) | {"routes": asdict(router.routes), "now": time.time()}

    def audited(request: Request) -> str:
        """The caller's fingerprint, once the audit log is known to be writable."""
        from core import audit

        try:
            audit.check_writable()
        except audit.AuditError as exc:
            log.error("%s", exc)
            raise HTTPException(503, "keys unchanged: the audit log cannot be written") from None
        return key_actor(presented_key(request))

    def persist_keys() -> bool:
        if router.cfg.keys_file is None:
            return False
        write_private(router.cfg.keys_file, "".join(k + "\n" for k in router.cfg.api_keys))
        return True

    @app.get("/admin/keys", dependencies=[Depends(key_admin)])
    async def list_keys() -> dict[str, Any]:
        return {"keys": [{"fingerprint": key_actor(k).removeprefix("key:"), "role": "client"}
                         for k in router.cfg.api_keys],
                "persisted_to_file": router.cfg.keys_file is not None}

    @app.post("/admin/keys", dependencies=[Depends(key_admin)], status_code=201)
    async def create_key(request: Request) -> dict[str, Any]:
        from core import audit

        new = secrets.token_urlsafe(32)
        fingerprint = key_actor(new).removeprefix("key:")
        who = audited(request)
        router.cfg.api_keys.append(new)
        persisted = persist_keys()
        audit.record("keys.create", f"client key {fingerprint}", "done",
                     "" if persisted else "in memory only (no INTENTOPS_API_KEYS_FILE)", actor_=who, role="admin")
        return {"key": new, "fingerprint": fingerprint, "role": "client", "persisted_to_file": persisted}

    @app.delete("/admin/keys/{fingerprint}", dependencies=[Depends(key_admin)])
    async def revoke_key(fingerprint: str, request: Request) -> dict[str, Any]:
        from core import audit

        matching = [k for k in router.cfg.api_keys if key_actor(k).removeprefix("key:") == fingerprint]
        if not matching:
            raise HTTPException(404, "no client key has that fingerprint")
        who = audited(request)
        if len(matching) == len(router.cfg.api_keys):
            audit.record("keys.revoke", f"client key {fingerprint}", "refused", "the last client key",
                         actor_=who, role="admin")
            raise HTTPException(409, "the last client key cannot be revoked: create its successor first")
        for k in matching:
            router.cfg.api_keys.remove(k)
        persisted = persist_keys()
        audit.record("keys.revoke", f"client key {fingerprint}", "done", "", actor_=who, role="admin")
        return {"revoked": fingerprint, "remaining": len(router.cfg.api_keys), "persisted_to_file": persisted}

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stable", action="append", default=[], help="a stable replica URL (repeat for more)")
    ap.add_argument("--canary", action="append", default=[], help="a canary replica URL (repeat for more)")
    ap.add_argument("--weight", type=float, default=0.0, help="share of traffic to the canary")
    ap.add_argument("--shadow", type=float, default=0.0, help="share of stable traffic mirrored to the canary")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8200)
    ap.add_argument("--max-inflight", type=int, default=512)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per upstream call")
    ap.add_argument("--no-auth", action="store_true", help="accept clients without API keys (local tests only)")
    ap.add_argument("--allow-upstream", action="append", default=[], metavar="PREFIX",
                    help="an upstream URL prefix the routes may name (scheme://host: or scheme://host:port); "
                         "default: the loopback interface only")
    ap.add_argument("--cache-size", type=int, default=0,
                    help="answers kept per variant in the response cache (0: no cache)")
    ap.add_argument("--health-interval", type=float, default=1.0, help="seconds between replica health checks")
    ap.add_argument("--max-body-bytes", type=int, default=512 * 1024,
                    help="larger request bodies are refused with 413 before they are read")
    args = ap.parse_args(argv)
    keys = load_api_keys()
    if not keys and not args.no_auth:
        ap.error("no API key configured: set INTENTOPS_API_KEYS or INTENTOPS_API_KEYS_FILE (or --no-auth)")
    admin = load_api_keys(var="INTENTOPS_ADMIN_KEYS")
    key_admin = load_api_keys(var="INTENTOPS_KEY_ADMIN_KEYS")
    keys_file = os.environ.get("INTENTOPS_API_KEYS_FILE")
    cfg = RouterConfig(api_keys=keys, admin_keys=admin, key_admin_keys=key_admin,
                       keys_file=Path(keys_file) if keys_file and not os.environ.get("INTENTOPS_API_KEYS") else None,
                       upstream_key=os.environ.get("INTENTOPS_UPSTREAM_KEY", ""),
                       timeout_s=args.timeout, max_inflight=args.max_inflight,
                       max_body_bytes=args.max_body_bytes, cache_size=args.cache_size,
                       health_interval_s=args.health_interval,
                       **({"allowed_upstreams": tuple(args.allow_upstream)} if args.allow_upstream else {}))
    for url in [*args.stable, *args.canary]:
        if not upstream_allowed(url, cfg.allowed_upstreams):
            ap.error(f"upstream {url} is not in the allow-list {list(cfg.allowed_upstreams)}")
    router = Router(cfg, Routes(args.stable[0] if args.stable else None, args.canary[0] if args.canary else None,
                                args.weight, args.shadow, list(args.stable), list(args.canary)))
    # uvloop and httptools explicitly (uvicorn's "auto" silently falls back to asyncio and h11).
    uvicorn.run(create_app(router), host=args.host, port=args.port, log_level="info", access_log=False,
                loop="uvloop", http="httptools")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
