"""Replica pools of the router: least-outstanding-requests balancing, ejection and
re-admission, graceful drain.

Each variant (stable, canary) is a list of model-server replicas. A request goes to the
healthy replica with the fewest requests outstanding from this router (ties broken at
random: Envoy's and NGINX's ``least_conn``); a replica whose call fails to connect, or that
answers 502/503/504, is skipped for the rest of that request, which is retried on another
replica of the variant (a prediction is idempotent), and after ``eject_after`` such
failures in a row it is ejected for ``eject_seconds``. The router's active health check
(``GET /health/ready`` every ``health_interval_s``) ejects a replica that stops answering
ready and re-admits one that answers again; it also records each replica's model version,
so the response cache can be emptied when a variant's version changes.

A replica removed from the routes is *draining*: it gets no new requests, the ones it has
finish, and ``/admin/pools`` shows it until its outstanding count is zero, which is what
the deployment waits for before it stops the process (scale-in and reload lose nothing).

Standard library only, no I/O: the router does the calls and feeds the outcomes in.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

VARIANTS = ("stable", "canary")
RETRY_STATUSES = frozenset({0, 502, 503, 504})  # 0: no answer (refused, reset, timeout)


@dataclass
class Replica:
    url: str
    outstanding: int = 0
    healthy: bool = True  # optimistic: a replica is added once it answered ready
    ejected_until: float = 0.0
    failures: int = 0  # consecutive failed calls
    version: str | None = None
    draining: bool = False
    served: int = 0
    added: float = field(default_factory=time.time)

    def usable(self, now: float) -> bool:
        return self.healthy and not self.draining and now >= self.ejected_until

    def view(self, now: float) -> dict[str, Any]:
        return {"url": self.url, "outstanding": self.outstanding, "healthy": self.healthy,
                "ejected": now < self.ejected_until, "draining": self.draining,
                "failures": self.failures, "version": self.version, "served": self.served}


class Pools:
    def __init__(self, eject_after: int = 2, eject_seconds: float = 5.0, rnd: random.Random | None = None) -> None:
        self.eject_after = eject_after
        self.eject_seconds = eject_seconds
        self.rnd = rnd or random.Random()
        self.members: dict[str, list[Replica]] = {v: [] for v in VARIANTS}
        self.draining: list[Replica] = []

    # -- membership -----------------------------------------------------------------------

    def set(self, variant: str, urls: list[str]) -> list[str]:
        """Make ``urls`` the variant's replicas (order kept); replicas no longer listed
        start draining. Returns the URLs that started draining."""
        current = {r.url: r for r in self.members[variant]}
        kept, gone = [], []
        for url in urls:
            if url in current:
                kept.append(current.pop(url))
                continue
            back = next((r for r in self.draining if r.url == url), None)
            if back is not None:  # re-added while draining: serve again
                self.draining.remove(back)
                back.draining = False
                kept.append(back)
            else:
                kept.append(Replica(url))
        for r in current.values():
            if any(r.url == u for v in VARIANTS if v != variant for u in self.urls(v)):
                continue  # moved to the other variant (a promotion): not draining
            r.draining = True
            self.draining.append(r)
            gone.append(r.url)
        self.members[variant] = kept
        self._forget_drained()
        return gone

    def urls(self, variant: str) -> list[str]:
        return [r.url for r in self.members[variant]]

    def all(self) -> list[Replica]:
        return [r for v in VARIANTS for r in self.members[v]] + self.draining

    def find(self, url: str) -> Replica | None:
        return next((r for r in self.all() if r.url == url), None)

    def _forget_drained(self) -> None:
        self.draining = [r for r in self.draining if r.outstanding > 0]

    # -- balancing ------------------------------------------------------------------------

    def pick(self, variant: str, exclude: set[str] = frozenset()) -> Replica | None:
        """The usable replica with the fewest outstanding requests (random among ties);
        None when no replica of the variant is usable."""
        now = time.time()
        best: list[Replica] = []
        low = None
        for r in self.members[variant]:
            if r.url in exclude or not r.usable(now):
                continue
            if low is None or r.outstanding < low:
                best, low = [r], r.outstanding
            elif r.outstanding == low:
                best.append(r)
        if not best:
            return None
        return best[0] if len(best) == 1 else self.rnd.choice(best)

    def usable_count(self, variant: str) -> int:
        now = time.time()
        return sum(r.usable(now) for r in self.members[variant])

    def started(self, r: Replica) -> None:
        r.outstanding += 1

    def finished(self, r: Replica, status: int) -> None:
        r.outstanding -= 1
        if status in RETRY_STATUSES:
            r.failures += 1
            if r.failures >= self.eject_after or status == 0:
                r.ejected_until = time.time() + self.eject_seconds
        else:
            r.failures = 0
            r.served += 1
        if r.draining and r.outstanding <= 0:
            self._forget_drained()

    def checked(self, r: Replica, ready: bool, version: str | None) -> str | None:
        """The outcome of an active health check; returns the previous version when the
        replica now reports another one."""
        previous = r.version
        r.healthy = ready
        if ready:
            r.failures = 0
            r.ejected_until = 0.0
            if version is not None:
                r.version = version
        return previous if ready and version is not None and previous not in (None, version) else None

    def view(self) -> dict[str, Any]:
        now = time.time()
        return {**{v: [r.view(now) for r in self.members[v]] for v in VARIANTS},
                "draining": [r.view(now) for r in self.draining]}
