"""The local services: ``intentops up`` / ``intentops down`` (``make up`` / ``make down``).

``up`` starts, bound to 127.0.0.1 by default:

* the MLflow tracking server with its UI and model registry, on a SQLite backend and a
  local artifact store under ``var/mlflow/`` (the store ``make mlflow`` serves), with
  MLflow's basic-auth app (``core/registry_auth.py``): the admin, pipeline and follower
  passwords are generated into ``var/services/credentials.json`` (mode 0600), the auth
  database is ``var/mlflow/auth/basic_auth.db``, and Airflow's tasks log as the pipeline
  user;
* ``airflow standalone`` (API server with the UI and the REST API v2, scheduler,
  dag-processor, triggerer; LocalExecutor, SQLite) in the project's ``AIRFLOW_HOME``, its
  tasks logging to that MLflow server;
* the serving stack (``deploy/``): the router and, once a model is champion, its server;
* Label Studio (``ops/labelstudio_service.py``), the review loop's labeling tool, from its
  own virtual environment ``.venv-label-studio`` on 127.0.0.1:8300 with a generated admin
  and API token (the ``label_studio`` entry of ``var/services/credentials.json``); like
  monitoring, when it is not installed or does not start, ``up`` says so and goes on;
* the monitoring stack (``ops/monitoring/``): Prometheus (scraping the router, the model
  servers, the autoscaler and the Pushgateway, with the alert rules), Alertmanager, the
  Pushgateway (training and pipeline metrics) and the project's alert receiver (the audit
  log, and DAG triggers for chosen alerts). When one of them cannot start (not
  installed, port taken) ``up`` says so and goes on: serving and the pipeline do not
  depend on monitoring, and ``intentops services`` shows what is down.

Each process is started in a session of its own and recorded in ``var/services/state.json``
with its start time, so ``down`` stops exactly what ``up`` started (whole process groups:
the standalone's scheduler, API server and task processes go with it), plus the serving
processes the deployment recorded; nothing else. A second ``up`` finds the recorded
processes alive and starts nothing. Logs: ``var/services/logs/<service>.log``.

Written here rather than with a process manager (supervisord, honcho): the services need
ordering (MLflow before Airflow's tasks, the Airflow database migrated and the registry pool
created before the scheduler), readiness checks on their HTTP endpoints, and a ``down``
that also stops what the pipeline's deploy task started; that is about as much code as the
configuration a manager would need, without a daemon of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from core import labeling_auth, procs, registry_auth
from core.config import PROJECT_ROOT, PipelineConfig, load_config


class ServiceError(RuntimeError):
    """A service did not start or stop; the message says which and where its log is."""


@dataclass(frozen=True)
class Ports:
    host: str
    airflow: int
    mlflow: int
    label_studio: int = labeling_auth.PORT

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Ports:
        env = os.environ if env is None else env
        return cls(host=env.get("INTENTOPS_SERVICES_HOST", "127.0.0.1"),
                   airflow=int(env.get("INTENTOPS_AIRFLOW_PORT", "8080")),
                   mlflow=int(env.get("INTENTOPS_MLFLOW_PORT", "5000")),
                   label_studio=int(env.get("INTENTOPS_LABEL_STUDIO_PORT", str(labeling_auth.PORT))))


def _root(cfg: PipelineConfig) -> Path:
    return cfg.resolve_path("var/services") if not os.environ.get("INTENTOPS_SERVICES_ROOT") \
        else Path(os.environ["INTENTOPS_SERVICES_ROOT"])


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME", str(PROJECT_ROOT / "var" / "airflow")))


def passwords_file() -> Path:
    """Where Airflow's simple auth manager writes the generated admin password."""
    return Path(os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
                               str(airflow_home() / "simple_auth_manager_passwords.json.generated")))


def admin_password() -> str:
    return json.loads(passwords_file().read_text())["admin"]


class Services:
    def __init__(self, cfg: PipelineConfig | None = None, ports: Ports | None = None) -> None:
        self.cfg = cfg or load_config()
        self.ports = ports or Ports.from_env()
        from ops.monitoring.stack import MonitoringPorts

        self.mon_ports = MonitoringPorts.from_env()
        self.root = _root(self.cfg)
        self.logs = self.root / "logs"
        self.state_file = self.root / "state.json"
        self.credentials_file = self.root / "credentials.json"
        self.bin = Path(sys.executable).parent

    # -- urls ---------------------------------------------------------------------------

    @property
    def airflow_url(self) -> str:
        return f"http://{self.ports.host}:{self.ports.airflow}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{self.ports.host}:{self.ports.mlflow}"

    @property
    def label_studio_url(self) -> str:
        return f"http://{self.ports.host}:{self.ports.label_studio}"

    # -- state --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text()) if self.state_file.exists() else {}

    def _save(self, state: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_file)

    alive = staticmethod(procs.alive)

    def registry_credentials(self) -> registry_auth.RegistryCredentials:
        return registry_auth.RegistryCredentials.load_or_create(self.credentials_file)

    def mlflow_store(self) -> Path:
        return Path(os.environ.get("INTENTOPS_MLFLOW_STORE") or self.cfg.resolve_path("var/mlflow"))

    # -- environment --------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment every service (and every Airflow task) runs with."""
        env = dict(os.environ)
        home = airflow_home()
        env.update({
            "PATH": f"{self.bin}{os.pathsep}{env.get('PATH', '')}",  # standalone spawns `airflow`
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": env.get("AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT_ROOT / "dags")),
            "AIRFLOW__CORE__PLUGINS_FOLDER": env.get("AIRFLOW__CORE__PLUGINS_FOLDER",
                                                     str(PROJECT_ROOT / "plugins")),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__API__HOST": self.ports.host,
            "AIRFLOW__API__PORT": str(self.ports.airflow),
            "AIRFLOW__API__BASE_URL": self.airflow_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.airflow_url}/execution/",
            "AIRFLOW_CONN_SPARK_DEFAULT": env.get("AIRFLOW_CONN_SPARK_DEFAULT",
                                                  '{"conn_type": "spark", "host": "local[*]"}'),
            "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
            "SPARK_LOCAL_IP": env.get("SPARK_LOCAL_IP", "127.0.0.1"),
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            **registry_auth.client_env(self.registry_credentials()),  # the pipeline user
            "INTENTOPS_PUSHGATEWAY_URL": self.mon_ports.url("pushgateway"),
            **self.mon_ports.statsd_env(),
            # The review task finds Label Studio here; its token in the credentials file.
            "INTENTOPS_LABEL_STUDIO_URL": self.label_studio_url,
            "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])]),
        })
        return env

    # -- processes ----------------------------------------------------------------------

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> dict[str, Any]:

        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        with log.open("a") as fh:
            fh.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd[:3])} ...\n")
            fh.flush()
            proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        return {"pid": proc.pid, "create_time": procs.start_time(proc.pid),
                "log": str(log.relative_to(PROJECT_ROOT) if log.is_relative_to(PROJECT_ROOT) else log)}

    def _wait(self, name: str, proc: dict[str, Any], url: str, timeout: float,
              ok=lambda r: r.status_code == 200) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive(proc):
                raise ServiceError(f"{name} exited during start-up; see {proc['log']}")
            try:
                if ok(httpx.get(url, timeout=5)):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise ServiceError(f"{name} not ready at {url} after {timeout:.0f}s; see {proc['log']}")

    @staticmethod
    def _kill_group(proc: dict[str, Any], grace: float = 20.0) -> None:
        import psutil

        try:
            pgid = os.getpgid(proc["pid"])
        except ProcessLookupError:
            return
        members = [p for p in psutil.process_iter() if _pgid(p) == pgid]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        _, alive = psutil.wait_procs(members, timeout=grace)
        for p in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                p.kill()
        psutil.wait_procs(alive, timeout=5)

    # -- up / down ----------------------------------------------------------------------

    def up(self) -> dict[str, Any]:
        state = self.state()
        env = self.env()
        started: list[str] = []
        if not self.alive(state.get("mlflow")):
            store = self.mlflow_store()
            (store / "artifacts").mkdir(parents=True, exist_ok=True)
            server_env = {**env, **registry_auth.server_env(self.registry_credentials(), store / "auth")}
            state["mlflow"] = self._spawn("mlflow", [
                str(self.bin / "mlflow"), "server", *registry_auth.server_args(),
                "--host", self.ports.host, "--port", str(self.ports.mlflow),
                "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
                "--artifacts-destination", str(store / "artifacts"), "--workers", "1"], server_env)
            self._save(state)
            started.append("mlflow")
        self._registry_ready(state)

        started += self._monitoring_up(state, env)
        started += self._label_studio_up(state)

        if not self.alive(state.get("airflow")):
            from core.stages import airflow_setup_commands

            for cmd in airflow_setup_commands(self.root):
                out = subprocess.run([str(self.bin / "airflow"), *cmd], env=env, cwd=PROJECT_ROOT,
                                     capture_output=True, text=True, timeout=900)
                if out.returncode != 0:
                    raise ServiceError(f"airflow {' '.join(cmd)} failed:\n{(out.stdout + out.stderr)[-3000:]}")
            state["airflow"] = self._spawn("airflow", [str(self.bin / "airflow"), "standalone"], env)
            self._save(state)
            started.append("airflow")
        self._wait("airflow", state["airflow"], f"{self.airflow_url}/api/v2/monitor/health", 300,
                   ok=_airflow_healthy)
        if not self.alive(state.get("preempt_controller")):
            # Airflow never preempts a running task: this loop does (training/preempt.py).
            state["preempt_controller"] = self._spawn("preempt_controller", [
                str(self.bin / "python"), "-m", "ops.preempt_controller", "--interval", "5"], env)
            self._save(state)
            started.append("preempt_controller")

        from deploy import task as deploy_task

        os.environ["MLFLOW_TRACKING_URI"] = self.mlflow_url  # the champion comes from this registry
        os.environ.update(registry_auth.client_env(self.registry_credentials()))
        stable = deploy_task.ensure_serving(self.cfg)
        state["serving"] = {"router": deploy_task.router_url(self.cfg),
                            "stable_version": stable and stable.get("version")}
        self._save(state)
        return {"started": started, **self.describe(state)}

    def _registry_ready(self, state: dict[str, Any]) -> None:
        """MLflow answers, and its basic-auth app has the pipeline's and follower's users."""
        self._wait("mlflow", state["mlflow"], f"{self.mlflow_url}/health", 180)
        try:
            registry_auth.provision(self.mlflow_url, self.registry_credentials())
        except registry_auth.RegistryAuthError as e:
            raise ServiceError(f"mlflow users not provisioned: {e}; see {state['mlflow']['log']}") from e

    MONITORING = ("alert_receiver", "statsd_bridge", "pushgateway", "alertmanager", "prometheus")

    def _monitoring_up(self, state: dict[str, Any], env: dict[str, str]) -> list[str]:
        from ops.monitoring import stack

        started = []
        folder = self.root / "monitoring"
        try:
            stack.write_configs(folder, self.mon_ports, self.cfg.resolve_path(self.cfg.deploy.root))
            cmds = stack.commands(folder, self.mon_ports, str(self.bin / "python"))
        except (OSError, FileNotFoundError) as exc:
            state["monitoring_error"] = str(exc)
            self._save(state)
            print(f"monitoring not started: {exc}", file=sys.stderr)
            return started
        state.pop("monitoring_error", None)
        receiver_env = {**env, "INTENTOPS_AIRFLOW_URL": self.airflow_url,
                        "INTENTOPS_AIRFLOW_PASSWORD_FILE": str(passwords_file())}
        for name in self.MONITORING:
            if self.alive(state.get(name)):
                continue
            state[name] = self._spawn(name, cmds[name], receiver_env if name == "alert_receiver" else env)
            self._save(state)
            try:
                self._wait(name, state[name], self.mon_ports.url(stack.PORT_OF[name]) + stack.HEALTH[name], 60)
                started.append(name)
            except ServiceError as exc:  # monitoring down: say so, serve and run anyway
                print(f"monitoring: {exc}", file=sys.stderr)
        return started

    def _label_studio_up(self, state: dict[str, Any]) -> list[str]:
        """Label Studio, tolerant like monitoring: not installed or not starting is said
        and recorded (``intentops services`` shows it), and the rest runs without it: the
        review task then skips, saying why, or fails when labeling.enabled is on."""
        from ops import labelstudio_service as ls

        if self.alive(state.get("label_studio")):
            return []
        if not ls.executable().exists():
            state["label_studio_error"] = f"{ls.executable()} missing: run `make label-studio`"
            self._save(state)
            print(f"label studio not started: {state['label_studio_error']}", file=sys.stderr)
            return []
        state.pop("label_studio_error", None)
        creds = labeling_auth.LabelStudioCredentials.load_or_create(self.credentials_file)
        data = self.root / "label-studio"
        data.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        state["label_studio"] = self._spawn("label_studio", ls.command(self.ports.host, self.ports.label_studio,
                                                                       data), ls.environment(creds, data))
        self._save(state)
        try:  # the first start migrates its database (about 30 s here)
            self._wait("label_studio", state["label_studio"], f"{self.label_studio_url}/health", 300)
        except ServiceError as exc:
            state["label_studio_error"] = str(exc)
            self._save(state)
            print(f"label studio: {exc}", file=sys.stderr)
            return []
        print(f"label studio ready in {time.monotonic() - t0:.0f}s at {self.label_studio_url}", file=sys.stderr)
        return ["label_studio"]

    def describe(self, state: dict[str, Any] | None = None) -> dict[str, Any]:
        state = self.state() if state is None else state
        from deploy.deployment import Deployment

        dep = Deployment(self.cfg)
        return {
            "airflow": {"url": self.airflow_url, "user": "admin", "password_file": _rel(passwords_file()),
                        "running": self.alive(state.get("airflow"))},
            "mlflow": {"url": self.mlflow_url, "running": self.alive(state.get("mlflow")),
                       "auth": "basic", "users": [registry_auth.ADMIN_USER, registry_auth.PIPELINE_USER,
                                                  registry_auth.FOLLOWER_USER],
                       "credentials_file": _rel(self.credentials_file)},
            "router": {"url": (state.get("serving") or {}).get("router"),
                       "client_keys_file": _rel(dep.secrets / "client_keys"),
                       "stable_version": (state.get("serving") or {}).get("stable_version")},
            **{name: {"url": self.mon_ports.url(PORT.get(name, name)), "running": self.alive(state.get(name))}
               for name in self.MONITORING},
            **({"monitoring_error": state["monitoring_error"]} if state.get("monitoring_error") else {}),
            "label_studio": {"url": self.label_studio_url, "running": self.alive(state.get("label_studio")),
                             "user": labeling_auth.ADMIN_EMAIL, "credentials_file": _rel(self.credentials_file),
                             "credentials_key": labeling_auth.KEY,
                             **({"error": state["label_studio_error"]} if state.get("label_studio_error") else {})},
            "preempt_controller": {"running": self.alive(state.get("preempt_controller")),
                                   "log": (state.get("preempt_controller") or {}).get("log")},
            "logs": _rel(self.logs),
        }

    def down(self) -> list[str]:
        from deploy.deployment import Deployment

        stopped = [f"serving: {s}" for s in Deployment(self.cfg).stop()]
        state = self.state()
        for name in ("preempt_controller", "airflow", "label_studio", *reversed(self.MONITORING), "mlflow"):  # tasks may still write to MLflow
            proc = state.get(name)
            if self.alive(proc):
                self._kill_group(proc)
                stopped.append(f"{name} (pid {proc['pid']})")
            state.pop(name, None)
        state.pop("serving", None)
        self._save(state)
        return stopped


PORT = {"alert_receiver": "receiver", "statsd_bridge": "statsd_http"}


def apply_client_credentials(env: dict[str, str] | None = None) -> bool:
    """Let a command run by hand (``intentops deploy rollback``) reach the authenticated
    registry of ``make up``: when ``MLFLOW_TRACKING_URI`` is that server and no MLflow
    user is set, the pipeline user's credentials from the services' credentials file are
    put into the environment. True when they were."""
    env = os.environ if env is None else env
    uri = (env.get("MLFLOW_TRACKING_URI") or "").rstrip("/")
    if not uri or env.get("MLFLOW_TRACKING_USERNAME"):
        return False
    svc = Services()
    if uri != svc.mlflow_url or not svc.credentials_file.exists():
        return False
    env.update(registry_auth.client_env(svc.registry_credentials()))
    return True


def _airflow_healthy(r: httpx.Response) -> bool:
    if r.status_code != 200:
        return False
    body = r.json()
    return all((body.get(c) or {}).get("status") == "healthy" for c in ("metadatabase", "scheduler"))


def _pgid(p) -> int | None:
    try:
        return os.getpgid(p.pid)
    except (ProcessLookupError, PermissionError):
        return None


def _rel(p: Path) -> str:
    return str(p.relative_to(PROJECT_ROOT)) if p.is_relative_to(PROJECT_ROOT) else str(p)
