"""StatsD in, Prometheus out: the pipeline's task metrics for the scrape.

Airflow reports task durations, task and run outcomes, scheduler heartbeats, pool slots and
executor queues over StatsD (``[metrics] statsd_on``); the project's stages report their
own duration and outcome (published, cache hit, failed) the same way
(``core/pushmetrics.stage``). Prometheus cannot read UDP, and Prometheus's own
``statsd_exporter`` is a Go binary that neither Debian nor PyPI ships here, so this module
does its job for the metric shapes these two senders use. It is small on purpose:

* a UDP listener takes StatsD lines: ``name[,tag=value...]:value|type[|@rate][|#tag:value,...]``
  (tags the InfluxDB way, which Airflow writes with ``statsd_influxdb_enabled``, or the
  DogStatsD way); types ``c`` (counter), ``g`` (gauge, ``+``/``-`` relative), ``ms``/``h``
  (timer), ``s`` (set: counted as distinct values);
* names become Prometheus names (``airflow.ti.finish`` -> ``airflow_ti_finish_total``,
  a timer ``airflow.dagrun.duration.success`` -> ``..._seconds`` histogram), tags become
  labels;
* ``/metrics`` serves them (``prometheus_client``), with the bridge's own counters of lines
  read, lines it could not parse and series refused over ``--max-series``.

Counters live as long as the bridge, which is what ``rate()`` and ``increase()`` need; a
restart starts them at zero, which Prometheus handles as a counter reset.

    python -m ops.monitoring.statsd_bridge --host 127.0.0.1 --udp-port 9125 --http-port 9102
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

log = logging.getLogger("intentops.statsd_bridge")

# Task and run durations run from milliseconds (a cache hit) to hours (training).
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, math.inf)
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")


class BadLine(ValueError):
    pass


@dataclass(frozen=True)
class Sample:
    name: str  # the StatsD name, tags removed
    kind: str  # c, g, ms, s
    value: float
    labels: tuple[tuple[str, str], ...]
    rate: float = 1.0
    relative: bool = False  # a gauge given as +n or -n
    raw: str = ""  # the set member, for ``s``


def prom_name(name: str) -> str:
    out = _NAME_BAD.sub("_", name.strip("."))
    return "_" + out if out[:1].isdigit() else out


def _label(key: str) -> str:
    out = _LABEL_BAD.sub("_", key)
    return "_" + out if not out or out[:1].isdigit() else out


def parse_line(line: str) -> Sample:
    """One StatsD line; ``BadLine`` says why one cannot be read."""
    line = line.strip()
    head, sep, rest = line.partition(":")
    if not sep or not head or not rest:
        raise BadLine(f"no name:value in {line[:80]!r}")
    name, *tag_parts = head.split(",")
    tags: dict[str, str] = {}
    for part in tag_parts:  # InfluxDB style: name,tag=value:...
        k, eq, v = part.partition("=")
        if not eq or not k:
            raise BadLine(f"tag {part!r} is not key=value")
        tags[_label(k)] = v
    fields = rest.split("|")
    if len(fields) < 2:
        raise BadLine(f"no type in {line[:80]!r}")
    value_s, kind = fields[0], fields[1]
    if kind == "h":
        kind = "ms"
    if kind not in ("c", "g", "ms", "s"):
        raise BadLine(f"unknown type {kind!r}")
    rate = 1.0
    for extra in fields[2:]:
        if extra.startswith("@"):
            try:
                rate = float(extra[1:])
            except ValueError:
                raise BadLine(f"bad sample rate {extra!r}") from None
            if not 0 < rate <= 1:
                raise BadLine(f"sample rate {rate} outside (0, 1]")
        elif extra.startswith("#"):  # DogStatsD style: |#key:value,key2:value2
            for part in filter(None, extra[1:].split(",")):
                k, _, v = part.partition(":")
                tags[_label(k)] = v
    if kind == "s":
        return Sample(name, kind, 1.0, tuple(sorted(tags.items())), raw=value_s)
    relative = kind == "g" and value_s[:1] in "+-"
    try:
        value = float(value_s)
    except ValueError:
        raise BadLine(f"value {value_s!r} is not a number") from None
    if not math.isfinite(value):
        raise BadLine(f"value {value_s!r} is not finite")
    return Sample(name, kind, value, tuple(sorted(tags.items())), rate, relative)


@dataclass
class _Series:
    value: float = 0.0
    count: float = 0.0
    buckets: list[float] = field(default_factory=lambda: [0.0] * len(BUCKETS))
    members: set[str] = field(default_factory=set)


class Store:
    """Every series the bridge has seen, by (Prometheus name, kind, labels)."""

    def __init__(self, max_series: int = 10000) -> None:
        self.max_series = max_series
        self._series: dict[tuple[str, str, tuple[tuple[str, str], ...]], _Series] = {}
        self._lock = threading.Lock()
        self.lines = 0
        self.bad_lines = 0
        self.refused = 0

    def feed(self, packet: str) -> None:
        for line in packet.splitlines():
            if not line.strip():
                continue
            with self._lock:
                self.lines += 1
            try:
                sample = parse_line(line)
            except BadLine as exc:
                with self._lock:
                    self.bad_lines += 1
                log.debug("unreadable StatsD line: %s", exc)
                continue
            self.add(sample)

    def add(self, s: Sample) -> None:
        key = (prom_name(s.name), s.kind, s.labels)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                if len(self._series) >= self.max_series:
                    self.refused += 1
                    return
                series = self._series[key] = _Series()
            if s.kind == "c":
                series.value += s.value / s.rate
            elif s.kind == "g":
                series.value = series.value + s.value if s.relative else s.value
            elif s.kind == "ms":
                seconds, weight = s.value / 1000.0, 1.0 / s.rate
                series.value += seconds * weight
                series.count += weight
                for i, bound in enumerate(BUCKETS):
                    if seconds <= bound:
                        series.buckets[i] += weight
            else:  # s
                series.members.add(s.raw)

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        with self._lock:
            items = sorted(self._series.items())
            own = (self.lines, self.bad_lines, self.refused)
        families: dict[tuple[str, str], object] = {}
        for (name, kind, labels), s in items:
            keys = [k for k, _ in labels]
            values = [v for _, v in labels]
            fam_key = (name, kind)
            if kind == "c":
                fam = families.setdefault(fam_key, CounterMetricFamily(name, f"StatsD counter {name}", labels=keys))
                fam.add_metric(values, s.value)
            elif kind == "g":
                fam = families.setdefault(fam_key, GaugeMetricFamily(name, f"StatsD gauge {name}", labels=keys))
                fam.add_metric(values, s.value)
            elif kind == "s":
                fam = families.setdefault(fam_key, GaugeMetricFamily(
                    name + "_distinct", f"StatsD set {name}: distinct values seen", labels=keys))
                fam.add_metric(values, len(s.members))
            else:
                fam = families.setdefault(fam_key, HistogramMetricFamily(
                    name + "_seconds", f"StatsD timer {name}, in seconds", labels=keys))
                fam.add_metric(values, [("+Inf" if math.isinf(b) else repr(float(b)), c)
                                        for b, c in zip(BUCKETS, s.buckets, strict=True)], s.value)
        yield from families.values()
        yield CounterMetricFamily("statsd_bridge_lines", "StatsD lines received", value=own[0])
        yield CounterMetricFamily("statsd_bridge_bad_lines", "StatsD lines that could not be parsed", value=own[1])
        yield CounterMetricFamily("statsd_bridge_refused_samples",
                                  "samples of new series refused over --max-series", value=own[2])
        yield GaugeMetricFamily("statsd_bridge_series", "series held", value=len(items))


def serve(host: str, udp_port: int, http_port: int, max_series: int = 10000) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    store = Store(max_series)
    registry = CollectorRegistry()
    registry.register(store)  # type: ignore[arg-type]  # a collector: it has collect()
    start_http_server(http_port, addr=host, registry=registry)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((host, udp_port))
    log.info("StatsD on udp://%s:%d, metrics on http://%s:%d/metrics", host, udp_port, host, http_port)
    while True:
        data, _ = sock.recvfrom(65535)
        store.feed(data.decode("utf-8", "replace"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--udp-port", type=int, default=9125)
    ap.add_argument("--http-port", type=int, default=9102)
    ap.add_argument("--max-series", type=int, default=10000)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(args.host, args.udp_port, args.http_port, args.max_series)


if __name__ == "__main__":
    main()
