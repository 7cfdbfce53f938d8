"""The scaled-out shape as local processes: ``intentops cluster-up`` / ``cluster-down``
(``make cluster-up`` / ``make cluster-down``).

docker/compose.yaml describes the shape a team grows into; this starts the same engines as
ordinary processes on one machine, configured **from the compose file itself**:

* Postgres (Debian's server binaries): one server, the databases and roles of
  ``docker/postgres/init-databases.sh`` (run as is), on 127.0.0.1;
* Redis (Debian's ``redis-server``), the Celery broker, password from a 0600 config file;
* a Spark standalone master (UI on 8080, like compose) and two workers (UIs 8081, 8082;
  ``SPARK_WORKER_CORES`` / ``SPARK_WORKER_MEMORY`` each), from the PySpark distribution;
* the MLflow server on Postgres (tracking store ``mlflow``, the basic-auth app's users in
  ``mlflow_auth``), artifacts in a local folder served by MLflow (compose uses MinIO,
  which is not installable here);
* Airflow 3 with the CeleryExecutor: ``db migrate`` and the pools, the api-server (port
  8090), scheduler, dag-processor, triggerer and two Celery workers that both consume the
  default queue (every task: Spark stages, training and the rest);
* the serving tier: the router (and the champion's server once there is one), as the
  deploy task starts it.

**One source of truth.** The Airflow components and their tasks run with compose's
``x-airflow-env`` block (which includes ``x-pipeline-env``), read from
docker/compose.yaml, its ``${VAR}`` values filled from the cluster's env file and compose's
host names rewritten to this machine's addresses (:data:`HOSTS`); a compose host this
module does not map fails ``cluster-up`` (a test keeps the table complete). The env file,
``var/cluster/cluster.env`` (mode 0600), is made once by ``docker/make_env.py`` from
docker/.env.example: every ``change-me`` is a fresh random secret, as for compose.

Everything listens on 127.0.0.1. State (pids, ports) in ``var/cluster/state.json``, logs in
``var/cluster/logs/``; ``cluster-down`` stops every process ``cluster-up`` started (and
the serving processes the deploy task started), waits for them, and leaves none behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from core import registry_auth
from core.config import PROJECT_ROOT, PipelineConfig, load_config
from core.secretfiles import create_private
from ops.services import Ports, ServiceError, Services, _airflow_healthy

COMPOSE = PROJECT_ROOT / "docker" / "compose.yaml"
ENV_EXAMPLE = PROJECT_ROOT / "docker" / ".env.example"
INIT_DATABASES = PROJECT_ROOT / "docker" / "postgres" / "init-databases.sh"
WORKERS = 2  # Spark workers and Celery workers alike


def cluster_root() -> Path:
    return Path(os.environ.get("INTENTOPS_CLUSTER_ROOT") or PROJECT_ROOT / "var" / "cluster")


def _make_env_module():
    spec = importlib.util.spec_from_file_location("intentops_make_env", PROJECT_ROOT / "docker" / "make_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def load_env_file(path: Path) -> dict[str, str]:
    """The cluster's settings and secrets (docker/.env syntax), made on first use."""
    if not path.exists():
        create_private(path, _make_env_module().render(ENV_EXAMPLE.read_text()))
    out = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            out[name.strip()] = value.strip()
    return out


_SECRET = re.compile(r"PASSWORD|SECRET|TOKEN|KEY", re.I)


def with_environment(settings: dict[str, str]) -> dict[str, str]:
    """As compose reads docker/.env: a variable set in the environment wins over the file
    (INTENTOPS_TRAINING_NNODES=2 make cluster-up). Secrets are the exception: they stay the
    generated ones of the 0600 file, so no inherited value can replace them."""
    return {k: (os.environ[k] if k in os.environ and not _SECRET.search(k) else v)
            for k, v in settings.items()}


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([-?])([^}]*))?\}")


def worker_running(root: Path, ti_id: str) -> str | None:
    """The Celery worker (its ``state.json`` key) whose process tree runs the task instance
    ``ti_id`` (Airflow names the task's process after it), or None."""
    import psutil

    state = json.loads((root / "state.json").read_text())
    for name in (f"celery_worker_{i}" for i in range(1, WORKERS + 1)):
        try:
            tree = psutil.Process(state[name]["pid"]).children(recursive=True)
        except (KeyError, psutil.Error):
            continue
        for p in tree:
            try:
                if ti_id in " ".join(p.cmdline()):
                    return name
            except psutil.Error:
                continue
    return None


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable syntax: ``${X}``, ``${X:-default}``, ``${X:?error}``; ``$$`` is a
    literal ``$``."""
    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        if env.get(name):
            return env[name]
        if op == "?":
            raise ServiceError(f"{name} is not set in the cluster's env file: {arg}")
        return arg if op == "-" else ""
    parts = value.split("$$")
    return "$".join(_VAR.sub(sub, p) for p in parts)


def compose_airflow_env(settings: dict[str, str]) -> dict[str, str]:
    """Compose's ``x-airflow-env`` (with ``x-pipeline-env``), variables filled in."""
    import yaml

    doc = yaml.safe_load(COMPOSE.read_text())
    return {k: interpolate(str(v), settings) for k, v in doc["x-airflow-env"].items()}


class Cluster(Services):
    """The scaled-out shape's processes; ``Services`` gives the spawning, waiting, killing
    and the MLflow credentials (generated into this shape's own credentials file)."""

    def __init__(self, cfg: PipelineConfig | None = None) -> None:
        root = cluster_root()
        self.settings = with_environment(load_env_file(root / "cluster.env"))
        s = self.settings
        self.pg_port = int(os.environ.get("INTENTOPS_CLUSTER_POSTGRES_PORT", "5432"))
        self.redis_port = int(os.environ.get("INTENTOPS_CLUSTER_REDIS_PORT", "6379"))
        self.spark_port = 7077
        self.spark_ui = int(s.get("SPARK_UI_PORT", "8080"))
        self.worker_uis = [int(s.get(f"SPARK_WORKER_{i}_UI_PORT", str(self.spark_ui + i))) for i in range(1, WORKERS + 1)]
        ports = Ports(host="127.0.0.1", airflow=int(s.get("AIRFLOW_PORT", "8090")),
                      mlflow=int(s.get("MLFLOW_PORT", "5000")))
        self.data = root / "data"
        os.environ.setdefault("INTENTOPS_SERVICES_ROOT", str(root))
        os.environ["AIRFLOW_HOME"] = str(root / "airflow")
        os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] = str(root / "airflow" / "passwords.json")
        cfg = cfg or load_config(overrides={"lake_root": str(self.data / "lake"),
                                            "deploy.root": str(self.data / "deploy")})
        super().__init__(cfg, ports)
        self.root = root
        self.logs = root / "logs"
        self.state_file = root / "state.json"
        self.credentials_file = root / "credentials.json"

    # -- addresses ----------------------------------------------------------------------

    @property
    def spark_master(self) -> str:
        return f"spark://127.0.0.1:{self.spark_port}"

    def hosts(self) -> list[tuple[str, str]]:
        """Compose's addresses -> this machine's, longest first."""
        return [
            ('"host": "spark://spark-master", "port": 7077', f'"host": "spark://127.0.0.1", "port": {self.spark_port}'),
            ("spark://spark-master:7077", self.spark_master),
            ("http://airflow-api-server:8080", self.airflow_url),
            ("http://mlflow:5000", self.mlflow_url),
            ("@postgres:5432/", f"@127.0.0.1:{self.pg_port}/"),
            ("@redis:6379/", f"@127.0.0.1:{self.redis_port}/"),
            ("/opt/venv/bin/python", sys.executable),
            ("/data/", f"{self.data}/"),
        ]

    # Compose names of services this shape does not start: the settings that point at them
    # are left out (the review task skips, monitoring sends are not made).
    NOT_STARTED = ("pushgateway", "statsd-bridge", "label-studio")

    def env(self) -> dict[str, str]:
        env = super().env()
        for k in [k for k in env if k.startswith(("AIRFLOW__METRICS__", "INTENTOPS_STATSD", "INTENTOPS_PUSHGATEWAY",
                                                  "INTENTOPS_LABEL_STUDIO"))]:
            env.pop(k)
        compose = compose_airflow_env(self.settings)
        for key, value in compose.items():
            for theirs, ours in self.hosts():
                value = value.replace(theirs, ours)
            if any(h in value for h in self.NOT_STARTED):
                continue
            if key.startswith("AIRFLOW__METRICS__"):
                continue  # the StatsD bridge is monitoring's, not started here
            # the host of a URL (after any user:password@), or of a bare host:port
            hosts = [a.rsplit("@", 1)[-1].split(":")[0] for a in re.findall(r"//([^/\s\"]+)", value)]
            hosts += re.findall(r"^([A-Za-z][A-Za-z0-9-]*):\d{2,5}$", value)
            unmapped = [h for h in hosts if h not in ("127.0.0.1", "localhost")]
            if unmapped:
                raise ServiceError(f"docker/compose.yaml's {key} names the host {unmapped[0]!r}, "
                                   "which ops/cluster.py does not map (Cluster.hosts)")
            env[key] = value
        env.update({
            "AIRFLOW_HOME": str(self.root / "airflow"),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.root / "airflow" / "passwords.json"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.ports.airflow),
            "AIRFLOW__API__BASE_URL": self.airflow_url,
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "INTENTOPS__DEPLOY__ROOT": str(self.data / "deploy"),
            # Airflow's own services listen on loopback only.
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
            "SPARK_LOCAL_IP": "127.0.0.1",
            # the address a multi-node training's other nodes reach this worker's rendezvous at
            "INTENTOPS_NODE_ADDR": "127.0.0.1",
            **registry_auth.client_env(self.registry_credentials()),
        })
        return env

    # -- the engines --------------------------------------------------------------------

    def _pg_bin(self, name: str) -> str:
        found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
        if found:
            return str(found[-1])
        exe = shutil.which(name)
        if not exe:
            raise ServiceError(f"{name} not found: install Debian's postgresql (make cluster-deps)")
        return exe

    def _as_postgres(self, cmd: list[str]) -> list[str]:
        # initdb and the server refuse to run as root: as Debian's postgres user then.
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd

    def _postgres_up(self, state: dict[str, Any]) -> bool:
        if self.alive(state.get("postgres")):
            return False
        data = self.root / "postgres"
        pwfile = self.root / "postgres.pw"
        if not (data / "PG_VERSION").exists():
            data.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0 and any(not (p.stat().st_mode & 0o001) for p in data.parents if p != Path("/")):
                raise ServiceError(f"{self.root}: Postgres runs as the postgres user, which cannot reach a "
                                   "folder inside it (a parent folder without o+x); use another "
                                   "INTENTOPS_CLUSTER_ROOT")
            create_private(pwfile, self.settings["POSTGRES_PASSWORD"] + "\n")
            if os.geteuid() == 0:
                shutil.chown(data, "postgres", "postgres")
                shutil.chown(pwfile, "postgres", "postgres")
            out = subprocess.run(self._as_postgres([
                self._pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=scram-sha-256",
                f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C.UTF-8"]), capture_output=True, text=True, timeout=300)
            pwfile.unlink()
            if out.returncode != 0:
                shutil.rmtree(data, ignore_errors=True)
                raise ServiceError(f"initdb failed: {(out.stdout + out.stderr)[-2000:]}")
            fresh = True
        else:
            fresh = False
        sock = self.root / "pg-socket"
        sock.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(sock, "postgres", "postgres")
        state["postgres"] = self._spawn("postgres", self._as_postgres([
            self._pg_bin("postgres"), "-D", str(data), "-p", str(self.pg_port), "-k", str(sock),
            "-c", "listen_addresses=127.0.0.1"]), dict(os.environ))
        self._save(state)
        pg_env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(self.pg_port),
                  "PGPASSWORD": self.settings["POSTGRES_PASSWORD"], "POSTGRES_USER": "postgres"}
        deadline = time.monotonic() + 60
        while subprocess.run([self._pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.pg_port)],
                             capture_output=True).returncode != 0:
            if time.monotonic() > deadline or not self.alive(state["postgres"]):
                raise ServiceError(f"postgres did not start; see {state['postgres']['log']}")
            time.sleep(0.5)
        if fresh:  # compose's own init script: the databases and roles
            out = subprocess.run(["bash", str(INIT_DATABASES)], env={
                **pg_env, "PATH": f"{Path(self._pg_bin('psql')).parent}{os.pathsep}{os.environ['PATH']}",
                "AIRFLOW_DB_PASSWORD": self.settings["AIRFLOW_DB_PASSWORD"],
                "MLFLOW_DB_PASSWORD": self.settings["MLFLOW_DB_PASSWORD"]},
                capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                raise ServiceError(f"{INIT_DATABASES.name} failed: {(out.stdout + out.stderr)[-2000:]}")
        return True

    def _redis_up(self, state: dict[str, Any]) -> bool:
        if self.alive(state.get("redis")):
            return False
        exe = shutil.which("redis-server")
        if not exe:
            raise ServiceError("redis-server not found: install Debian's redis-server (make cluster-deps)")
        conf = self.root / "redis.conf"
        create_private(conf, "")
        conf.write_text(f"bind 127.0.0.1\nport {self.redis_port}\nrequirepass {self.settings['REDIS_PASSWORD']}\n"
                        f"save \"\"\nappendonly no\ndir {self.root}\n")
        state["redis"] = self._spawn("redis", [exe, str(conf)], dict(os.environ))
        self._save(state)
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.redis_port, password=self.settings["REDIS_PASSWORD"],
                             socket_timeout=2)
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.ping():
                    return True
            except redis.RedisError:
                pass
            if time.monotonic() > deadline or not self.alive(state["redis"]):
                raise ServiceError(f"redis did not start; see {state['redis']['log']}")
            time.sleep(0.5)

    def _spark_class(self) -> str:
        import pyspark

        return str(Path(pyspark.__file__).parent / "bin" / "spark-class")

    def _spark_up(self, state: dict[str, Any], env: dict[str, str]) -> list[str]:
        started = []
        spark_env = {**env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        if not self.alive(state.get("spark_master")):
            state["spark_master"] = self._spawn("spark_master", [
                self._spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(self.spark_port), "--webui-port", str(self.spark_ui)], spark_env)
            self._save(state)
            started.append("spark_master")
        self._wait("spark_master", state["spark_master"], f"http://127.0.0.1:{self.spark_ui}/json/", 120)
        for i, ui in enumerate(self.worker_uis, start=1):
            name = f"spark_worker_{i}"
            if self.alive(state.get(name)):
                continue
            work = self.root / f"spark-work-{i}"
            work.mkdir(parents=True, exist_ok=True)
            state[name] = self._spawn(name, [
                self._spark_class(), "org.apache.spark.deploy.worker.Worker", self.spark_master,
                "--host", "127.0.0.1", "--cores", self.settings.get("SPARK_WORKER_CORES", "1"),
                "--memory", self.settings.get("SPARK_WORKER_MEMORY", "2g"), "--webui-port", str(ui),
                "--work-dir", str(work)], spark_env)
            self._save(state)
            started.append(name)
        deadline = time.monotonic() + 120
        while len(self.spark_workers_alive()) < WORKERS:
            if time.monotonic() > deadline:
                raise ServiceError(f"the Spark workers did not register with the master; see {self.logs}")
            time.sleep(1)
        return started

    def spark_workers_alive(self) -> list[dict[str, Any]]:
        try:
            info = httpx.get(f"http://127.0.0.1:{self.spark_ui}/json/", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return []
        return [w for w in info.get("workers", []) if w.get("state") == "ALIVE"]

    def _mlflow_up(self, state: dict[str, Any], env: dict[str, str]) -> bool:
        if self.alive(state.get("mlflow")):
            return False
        pw = self.settings["MLFLOW_DB_PASSWORD"]
        db = f"postgresql+psycopg2://mlflow:{pw}@127.0.0.1:{self.pg_port}"
        artifacts = self.root / "mlflow-artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        creds = self.registry_credentials()
        # The auth app's database on Postgres too; its URI carries no password (PGPASSWORD).
        server_env = {**env, **registry_auth.server_env(
                          creds, self.root / "mlflow-auth",
                          f"postgresql+psycopg2://mlflow@127.0.0.1:{self.pg_port}/mlflow_auth"),
                      "PGPASSWORD": pw,
                      # the backend store URI with its password, read from the environment
                      "MLFLOW_BACKEND_STORE_URI": f"{db}/mlflow"}
        state["mlflow"] = self._spawn("mlflow", [
            str(self.bin / "mlflow"), "server", *registry_auth.server_args(), "--host", "127.0.0.1",
            "--port", str(self.ports.mlflow), "--artifacts-destination", str(artifacts),
            "--workers", "2"], server_env)
        self._save(state)
        return True

    AIRFLOW = ("api_server", "scheduler", "dag_processor", "triggerer",
               *(f"celery_worker_{i}" for i in range(1, WORKERS + 1)))

    def _airflow_up(self, state: dict[str, Any], env: dict[str, str]) -> list[str]:
        from core.stages import airflow_setup_commands

        if all(self.alive(state.get(n)) for n in self.AIRFLOW):
            return []
        home = self.root / "airflow"
        home.mkdir(parents=True, exist_ok=True)
        pwfile = home / "passwords.json"
        create_private(pwfile, json.dumps({"admin": self.settings["AIRFLOW_ADMIN_PASSWORD"]}))
        for cmd in airflow_setup_commands(home):
            out = subprocess.run([str(self.bin / "airflow"), *cmd], env=env, cwd=PROJECT_ROOT,
                                 capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                raise ServiceError(f"airflow {' '.join(cmd)} failed:\n{(out.stdout + out.stderr)[-3000:]}")
        commands = {
            "api_server": ["api-server", "--host", "127.0.0.1", "--port", str(self.ports.airflow)],
            # --skip-serve-logs: the triggerer's log server, like the workers', binds every
            # interface; on one machine the api-server reads the shared log folder.
            "scheduler": ["scheduler"], "dag_processor": ["dag-processor"],
            "triggerer": ["triggerer", "--skip-serve-logs"],
        }
        started = []
        for name, args in commands.items():
            if not self.alive(state.get(name)):
                state[name] = self._spawn(name, [str(self.bin / "airflow"), *args], env)
                self._save(state)
                started.append(name)
        self._wait("api_server", state["api_server"], f"{self.airflow_url}/api/v2/monitor/health", 300,
                   ok=_airflow_healthy)
        for i in range(1, WORKERS + 1):
            name = f"celery_worker_{i}"
            if self.alive(state.get(name)):
                continue
            # --skip-serve-logs: Airflow's worker log server binds every interface (no host
            # setting); on one machine the api-server reads the task logs from the shared
            # log folder instead.
            worker_env = {**env, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(8792 + i)}
            state[name] = self._spawn(name, [str(self.bin / "airflow"), "celery", "worker", "--skip-serve-logs",
                                             "--celery-hostname", f"worker{i}@%h", "--queues", "default",
                                             "--concurrency", self.settings.get("AIRFLOW_WORKER_CONCURRENCY", "2")],
                                      worker_env)
            self._save(state)
            started.append(name)
        return started

    def celery_workers_online(self, env: dict[str, str] | None = None) -> list[str]:
        """The Celery workers that answer a ping through the broker."""
        env = env or self.env()
        out = subprocess.run([str(self.bin / "celery"), "--app", "airflow.providers.celery.executors.celery_executor.app",
                              "inspect", "ping", "--timeout", "5", "--json"], env=env, cwd=PROJECT_ROOT,
                             capture_output=True, text=True, timeout=60)
        try:
            return sorted(k for d in json.loads(out.stdout or "[]") for k in d)
        except ValueError:
            return sorted(re.findall(r"(worker\d+@\S+?):", out.stdout))

    # -- up / down ----------------------------------------------------------------------

    def up(self) -> dict[str, Any]:
        state = self.state()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.data / "lake").mkdir(parents=True, exist_ok=True)
        started = []
        if self._postgres_up(state):
            started.append("postgres")
        if self._redis_up(state):
            started.append("redis")
        env = self.env()
        started += self._spark_up(state, env)
        if self._mlflow_up(state, env):
            started.append("mlflow")
        self._registry_ready(state)
        started += self._airflow_up(state, env)
        deadline = time.monotonic() + 180
        while len(self.celery_workers_online(env)) < WORKERS:
            if time.monotonic() > deadline:
                raise ServiceError(f"the Celery workers did not come online; see {self.logs}")
            time.sleep(3)

        from deploy import task as deploy_task

        os.environ.update({"MLFLOW_TRACKING_URI": self.mlflow_url, **registry_auth.client_env(self.registry_credentials())})
        stable = deploy_task.ensure_serving(self.cfg)
        state["serving"] = {"router": deploy_task.router_url(self.cfg), "stable_version": stable and stable.get("version")}
        self._save(state)
        return {"started": started, **self.describe(state)}

    def describe(self, state: dict[str, Any] | None = None) -> dict[str, Any]:
        state = self.state() if state is None else state
        from deploy.deployment import Deployment

        dep = Deployment(self.cfg)
        return {
            "shape": "cluster (local processes, configured from docker/compose.yaml)",
            "airflow": {"url": self.airflow_url, "user": "admin", "running": self.alive(state.get("api_server")),
                        "password_file": str(self.root / "airflow" / "passwords.json")},
            "executor": {"kind": "CeleryExecutor", "broker": f"redis://127.0.0.1:{self.redis_port}/0",
                         "components": {n: self.alive(state.get(n)) for n in self.AIRFLOW}},
            "postgres": {"address": f"127.0.0.1:{self.pg_port}", "running": self.alive(state.get("postgres")),
                         "databases": ["airflow", "mlflow", "mlflow_auth"]},
            "redis": {"address": f"127.0.0.1:{self.redis_port}", "running": self.alive(state.get("redis"))},
            "spark_master": {"url": self.spark_master, "ui": f"http://127.0.0.1:{self.spark_ui}",
                             "running": self.alive(state.get("spark_master"))},
            "spark_workers": [{"ui": f"http://127.0.0.1:{ui}", "running": self.alive(state.get(f"spark_worker_{i}"))}
                              for i, ui in enumerate(self.worker_uis, start=1)],
            "mlflow": {"url": self.mlflow_url, "running": self.alive(state.get("mlflow")),
                       "backend": f"postgresql://127.0.0.1:{self.pg_port}/mlflow", "auth": "basic",
                       "artifacts": str(self.root / "mlflow-artifacts"),
                       "credentials_file": str(self.credentials_file)},
            "router": {"url": (state.get("serving") or {}).get("router"),
                       "client_keys_file": str(dep.secrets / "client_keys"),
                       "stable_version": (state.get("serving") or {}).get("stable_version")},
            "settings_file": str(self.root / "cluster.env"),
            "logs": str(self.logs),
        }

    ORDER = ("celery_worker_1", "celery_worker_2", "scheduler", "triggerer", "dag_processor", "api_server",
             "mlflow", *(f"spark_worker_{i}" for i in range(WORKERS, 0, -1)), "spark_master", "redis", "postgres")

    def down(self) -> list[str]:
        from deploy.deployment import Deployment

        stopped = [f"serving: {s}" for s in Deployment(self.cfg).stop()]
        state = self.state()
        for name in self.ORDER:
            proc = state.get(name)
            if name == "postgres" and self.alive(proc):  # a fast shutdown: no wait for clients
                subprocess.run(self._as_postgres([self._pg_bin("pg_ctl"), "stop", "-D", str(self.root / "postgres"),
                                                  "-m", "fast", "-w", "-t", "60"]), capture_output=True, timeout=90)
                stopped.append(f"postgres (pid {proc['pid']})")
            elif self.alive(proc):
                self._kill_group(proc)
                stopped.append(f"{name} (pid {proc['pid']})")
            state.pop(name, None)
        state.pop("serving", None)
        self._save(state)
        # Anything else still running from this shape's folder (a process a killed task
        # left behind): stopped too, so nothing outlives cluster-down.
        import psutil

        mine = str(self.root) + os.sep
        strays = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if p.pid != os.getpid() and mine in " ".join(p.info["cmdline"] or []):
                    strays.append(p)
            except psutil.Error:
                continue
        for p in strays:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(strays, timeout=20)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        stopped += [f"stray pid {p.pid}" for p in strays]
        return stopped
