"""The monitoring stack as local processes: Prometheus, Alertmanager, the Pushgateway and
the project's alert receiver (Debian's ``prometheus``, ``prometheus-alertmanager`` and
``prometheus-pushgateway`` packages; ``make test-deps`` installs them).

``write_configs`` writes ``prometheus.yml`` and ``alertmanager.yml`` into a folder;
``commands`` gives the command line of each process. What Prometheus scrapes:

* ``intentops-router``, ``intentops-servers``, ``intentops-autoscaler``: file-based
  discovery from the files every deployment keeps up to date
  (``<deploy.root>/prometheus/<dataset>.{router,servers,autoscaler}.json``, written by
  ``Deployment.save``), so replicas the autoscaler adds are scraped within seconds;
* ``pushgateway``: training, pipeline and deployment metrics (``core/pushmetrics.py``);
* ``statsd-bridge``: Airflow's StatsD metrics (task durations and outcomes, run durations,
  scheduler heartbeats, pools, executor queues) and each stage's duration and outcome
  (published, cache hit, failed), through ``ops/monitoring/statsd_bridge.py``;
* the rules of ``ops/monitoring/rules.yml``, whose alerts go to Alertmanager, which sends
  them to the receiver (``ops/monitoring/receiver.py``: the audit log, and a DAG trigger
  for chosen alerts).

Intervals are short (5 s scrape and evaluation, 5 s group wait) so a failing server
pages within a minute; ``INTENTOPS_MONITORING_INTERVAL`` changes both.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RULES = Path(__file__).resolve().parent / "rules.yml"
JOBS = ("router", "servers", "autoscaler")


@dataclass(frozen=True)
class MonitoringPorts:
    host: str = "127.0.0.1"
    prometheus: int = 9090
    alertmanager: int = 9093
    pushgateway: int = 9091
    receiver: int = 9095
    statsd: int = 9125  # UDP
    statsd_http: int = 9102

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> MonitoringPorts:
        env = os.environ if env is None else env
        return cls(host=env.get("INTENTOPS_SERVICES_HOST", "127.0.0.1"),
                   prometheus=int(env.get("INTENTOPS_PROMETHEUS_PORT", "9090")),
                   alertmanager=int(env.get("INTENTOPS_ALERTMANAGER_PORT", "9093")),
                   pushgateway=int(env.get("INTENTOPS_PUSHGATEWAY_PORT", "9091")),
                   receiver=int(env.get("INTENTOPS_ALERT_RECEIVER_PORT", "9095")),
                   statsd=int(env.get("INTENTOPS_STATSD_PORT", "9125")),
                   statsd_http=int(env.get("INTENTOPS_STATSD_HTTP_PORT", "9102")))

    def url(self, name: str) -> str:
        return f"http://{self.host}:{getattr(self, name)}"

    def statsd_env(self) -> dict[str, str]:
        """What sends to the StatsD bridge: Airflow (tags the InfluxDB way, no run or job ids
        as labels, no legacy names that carry the DAG and task in the metric's name) and the
        project's stages."""
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": self.host,
                "AIRFLOW__METRICS__STATSD_PORT": str(self.statsd),
                "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",
                "AIRFLOW__METRICS__LEGACY_NAMES_ON": "False",
                "INTENTOPS_STATSD_ADDR": f"{self.host}:{self.statsd}"}


def binaries() -> dict[str, str | None]:
    return {"prometheus": shutil.which("prometheus"), "alertmanager": shutil.which("prometheus-alertmanager")
            or shutil.which("alertmanager"), "pushgateway": shutil.which("prometheus-pushgateway")
            or shutil.which("pushgateway"), "promtool": shutil.which("promtool")}


def prometheus_config(ports: MonitoringPorts, deploy_root: Path, interval: str = "5s") -> dict[str, Any]:
    sd = [{"job_name": f"intentops-{job}", "file_sd_configs": [
        {"files": [str(deploy_root / "prometheus" / f"*.{job}.json")], "refresh_interval": interval}]}
        for job in JOBS]
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{ports.host}:{ports.alertmanager}"]}]}]},
        "scrape_configs": [*sd,
                           {"job_name": "pushgateway", "honor_labels": True,
                            "static_configs": [{"targets": [f"{ports.host}:{ports.pushgateway}"]}]},
                           {"job_name": "statsd-bridge", "honor_labels": True,
                            "static_configs": [{"targets": [f"{ports.host}:{ports.statsd_http}"]}]},
                           {"job_name": "prometheus",
                            "static_configs": [{"targets": [f"{ports.host}:{ports.prometheus}"]}]}],
    }


def alertmanager_config(receiver_url: str, group_wait: str = "5s") -> dict[str, Any]:
    return {
        "route": {"receiver": "intentops", "group_by": ["alertname", "instance"], "group_wait": group_wait,
                  "group_interval": "30s", "repeat_interval": "4h"},
        "receivers": [{"name": "intentops", "webhook_configs": [
            {"url": f"{receiver_url}/alerts", "send_resolved": True, "max_alerts": 0}]}],
    }


def write_configs(folder: Path, ports: MonitoringPorts, deploy_root: Path) -> dict[str, Path]:
    interval = os.environ.get("INTENTOPS_MONITORING_INTERVAL", "5s")
    folder.mkdir(parents=True, exist_ok=True)
    prom, am = folder / "prometheus.yml", folder / "alertmanager.yml"
    prom.write_text(yaml.safe_dump(prometheus_config(ports, deploy_root, interval), sort_keys=False))
    am.write_text(yaml.safe_dump(alertmanager_config(ports.url("receiver"), interval), sort_keys=False))
    return {"prometheus": prom, "alertmanager": am}


def commands(folder: Path, ports: MonitoringPorts, python: str) -> dict[str, list[str]]:
    """Each process's command line, in start order (the receiver before Alertmanager
    before Prometheus)."""
    b = binaries()
    missing = [k for k in ("prometheus", "alertmanager", "pushgateway") if not b[k]]
    if missing:
        raise FileNotFoundError(f"not installed: {', '.join(missing)} (Debian: make test-deps, or apt-get install "
                                "prometheus prometheus-alertmanager prometheus-pushgateway)")
    h = ports.host
    return {
        "alert_receiver": [python, "-m", "ops.monitoring.receiver", "--host", h, "--port", str(ports.receiver)],
        "statsd_bridge": [python, "-m", "ops.monitoring.statsd_bridge", "--host", h,
                          "--udp-port", str(ports.statsd), "--http-port", str(ports.statsd_http)],
        "pushgateway": [b["pushgateway"], f"--web.listen-address={h}:{ports.pushgateway}"],
        "alertmanager": [b["alertmanager"], f"--config.file={folder / 'alertmanager.yml'}",
                         f"--storage.path={folder / 'alertmanager-data'}",
                         f"--web.listen-address={h}:{ports.alertmanager}", "--cluster.listen-address="],
        "prometheus": [b["prometheus"], f"--config.file={folder / 'prometheus.yml'}",
                       f"--storage.tsdb.path={folder / 'prometheus-data'}", "--storage.tsdb.retention.time=15d",
                       f"--web.listen-address={h}:{ports.prometheus}"],
    }


HEALTH = {"alert_receiver": "/health/ready", "statsd_bridge": "/metrics", "pushgateway": "/-/ready",
          "alertmanager": "/-/ready", "prometheus": "/-/ready"}
PORT_OF = {"alert_receiver": "receiver", "statsd_bridge": "statsd_http", "pushgateway": "pushgateway",
           "alertmanager": "alertmanager", "prometheus": "prometheus"}


def compose_prometheus_config(interval: str = "5s") -> dict[str, Any]:
    """The compose shape's Prometheus (docker/monitoring/prometheus.yml is this, a test
    keeps them equal): fixed replica counts, so static targets on the compose network."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": ["/etc/prometheus/rules.yml"],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": ["alertmanager:9093"]}]}]},
        "scrape_configs": [
            {"job_name": "intentops-router", "static_configs": [{"targets": ["router:8200"]}]},
            {"job_name": "intentops-servers", "static_configs": [
                {"targets": ["model-server:8100", "model-server-2:8100"], "labels": {"variant": "stable"}},
                {"targets": ["model-server-canary:8100"], "labels": {"variant": "canary"}}]},
            {"job_name": "pushgateway", "honor_labels": True, "static_configs": [{"targets": ["pushgateway:9091"]}]},
            {"job_name": "statsd-bridge", "honor_labels": True,
             "static_configs": [{"targets": ["statsd-bridge:9102"]}]},
            {"job_name": "prometheus", "static_configs": [{"targets": ["localhost:9090"]}]},
        ],
    }


def compose_alertmanager_config() -> dict[str, Any]:
    return alertmanager_config("http://alert-receiver:9095")

