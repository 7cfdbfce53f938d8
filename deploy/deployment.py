"""The deployment on one machine: the router and the model servers as processes.

Everything lives under ``<deploy.root>/<dataset>/`` (``var/deploy/banking77`` for the demo):

* ``state.json``: what runs (router, stable, canary: pid, port, URL, model version, build);
* ``replicas.json``: the stable variant's extra replicas (same version and build as
  ``stable``), which ``scale`` and the autoscaler (``deploy/autoscaler.py``) manage;
* ``builds/v<N>/``: the int8 builds downloaded from the registry, so a restart does not
  need MLflow;
* ``logs/``: one log file per process;
* ``secrets/`` (mode 0700): the keys. ``client_keys`` are what clients send to the router
  (``INTENTOPS_API_KEYS`` when set, otherwise one generated key); ``internal_key`` is what
  the router sends to the servers; ``admin_key`` (the operator role) changes the routes;
  ``key_admin_key`` (the admin role) manages the client keys (``intentops deploy keys``).
  Generated keys are never logged, only the file's location.

Processes run in their own session, so they outlive the Airflow task that started them
(the stable model must keep serving after the DAG run ends); ``stop`` ends only the
processes recorded in the state, and only if their command line is still ours.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from core import procs
from core.config import PROJECT_ROOT, PipelineConfig
from core.secretfiles import create_private, write_private

log = logging.getLogger(__name__)
ALIAS_CHAMPION = "champion"
ALIAS_PREVIOUS = "previous"
ALIAS_CHALLENGER = "challenger"
DECISION_TAG = "intentops.deploy.decision"
REASON_TAG = "intentops.deploy.reason"


# The processes this process started, by pid: wait_ready asks them, not /proc, whether
# they exited (and reaps them).
_CHILDREN: dict[int, subprocess.Popen] = {}


class DeployError(RuntimeError):
    """A deployment step that cannot go on (refused build, server never ready...)."""


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Deployment:
    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.d = cfg.deploy
        self.root = cfg.deploy_dir  # <deploy.root>/<dataset>
        for sub in ("builds", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.secrets = self.root / "secrets"
        self.secrets.mkdir(mode=0o700, exist_ok=True)
        self.state_file = self.root / "state.json"

    # -- keys ---------------------------------------------------------------------------

    def _secret(self, name: str) -> str:
        f = self.secrets / name
        create_private(f, secrets.token_urlsafe(32) + "\n")  # mode 0600, whole, once
        return f.read_text().splitlines()[0].strip()

    @property
    def client_keys_file(self) -> Path:
        f = self.secrets / "client_keys"
        from deploy.server import load_api_keys

        given = load_api_keys()
        if given:  # the operator's keys win; written for the router process to read
            write_private(f, "\n".join(given) + "\n")
        elif not f.exists():
            self._secret("client_keys")
        return f

    def client_key(self) -> str:
        return self.client_keys_file.read_text().split()[0]

    # -- state --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        if self.state_file.exists():
            return json.loads(self.state_file.read_text())
        return {"router": None, "stable": None, "canary": None}

    def save(self, state: dict[str, Any]) -> None:
        state["updated"] = time.time()
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_file)  # readers see the old or the new state
        self._write_targets()

    def _write_targets(self) -> None:
        """What Prometheus scrapes of this deployment: file-based discovery from
        ``<deploy.root>/prometheus/<dataset>.{router,servers,autoscaler}.json`` (Prometheus
        globs the last path segment only; ops/monitoring/stack.py).

        Called after every change of the state or the replicas, by whichever process made
        it (the CLI, the autoscaler, the deploy task): under a lock, from the files as they
        are then, so that a writer holding an older view cannot overwrite a newer one (an
        added replica missing from discovery until the next change)."""
        import fcntl

        folder = self.root.parent / "prometheus"
        folder.mkdir(exist_ok=True)
        with (folder / f".{self.cfg.dataset}.targets.lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                self._write_targets_locked(folder, self.state(), self.extras())
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _write_targets_locked(self, folder: Path, state: dict[str, Any], extras: list[dict[str, Any]]) -> None:
        def target(p: Any, **labels: str) -> list[dict[str, Any]]:
            if not (p and p.get("url") and self.alive(p)):
                return []
            return [{"targets": [p["url"].split("://", 1)[1]],
                     "labels": {"dataset": self.cfg.dataset, **labels}}]

        groups = {
            "router": target(state.get("router")),
            "servers": [*target(state.get("stable"), variant="stable"), *target(state.get("canary"), variant="canary"),
                        *[g for e in extras for g in target(e, variant="stable")]],
            "autoscaler": target(state.get("autoscaler")),
        }
        for job, group in groups.items():
            tmp = folder / f".{self.cfg.dataset}.{job}.json.tmp"
            tmp.write_text(json.dumps(group, indent=1))
            os.replace(tmp, folder / f"{self.cfg.dataset}.{job}.json")

    # -- processes ----------------------------------------------------------------------

    alive = staticmethod(procs.alive)  # pid plus start time (pids get reused)

    def _spawn(self, module: str, args: list[str], env: dict[str, str | None], logname: str,
               port: int = 0) -> dict[str, Any]:
        port = port or _free_port(self.d.host)
        env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(
            [str(PROJECT_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        env = {k: v for k, v in env.items() if v is not None}  # None: not inherited
        logf = (self.root / "logs" / f"{logname}.log").open("a")
        proc = subprocess.Popen([sys.executable, "-m", module, *args, "--host", self.d.host, "--port", str(port)],
                                cwd=PROJECT_ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()
        _CHILDREN[proc.pid] = proc
        return {"pid": proc.pid, "port": port, "url": f"http://{self.d.host}:{port}", "module": module,
                "log": str(self.root / "logs" / f"{logname}.log"), "started": time.time(),
                "create_time": procs.start_time(proc.pid)}

    def wait_ready(self, proc: dict[str, Any], timeout: float | None = None) -> None:
        deadline = time.time() + (timeout or self.d.ready_timeout_seconds)
        child = _CHILDREN.get(proc["pid"])
        while time.time() < deadline:
            # Our own child: its exit status is the truth (a /proc read under heavy load once
            # reported a live server as gone, and the rollout aborted while it kept running).
            code = child.poll() if child is not None else (None if self.alive(proc) else "unknown")
            if code is not None:
                raise DeployError(f"{proc['module']} exited (status {code}) before it was ready; "
                                  f"log: {proc['log']}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{proc['url']}/health/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.25)
        self.kill(proc)
        raise DeployError(f"{proc['module']} on port {proc['port']} not ready after "
                          f"{timeout or self.d.ready_timeout_seconds:.0f} s; stopped it; log: {proc['log']}")

    def kill(self, proc: dict[str, Any] | None, grace: float = 15.0) -> None:
        """SIGTERM (uvicorn finishes the requests in flight), then SIGKILL after ``grace``."""
        if not self.alive(proc):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc["pid"], signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline and self.alive(proc):
            time.sleep(0.1)
        if self.alive(proc):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc["pid"], signal.SIGKILL)

    def stop_unrecorded_children(self) -> list[int]:
        """Stop the servers this process started that neither ``state.json`` nor the replicas
        file records: one still starting when the process was told to stop. They run in
        their own session, so they would outlive this process, and nothing would stop them
        (a CI run of 2026-12-07 left a replica the autoscaler was starting when the
        deployment stopped). Returns their pids."""
        state = self.state()
        recorded = {e.get("pid") for e in self.extras()} | {
            (state.get(role) or {}).get("pid") for role in ("stable", "canary", "router", "autoscaler")}
        stopped = []
        for pid, child in list(_CHILDREN.items()):
            if pid not in recorded and child.poll() is None:
                self.kill({"pid": pid, "create_time": procs.start_time(pid)}, grace=10)
                child.wait(timeout=10)  # reaped: no zombie left behind
                stopped.append(pid)
        return stopped

    def start_server(self, build: Path, version: str, role: str,
                     extra: list[str] | None = None) -> dict[str, Any]:
        d = self.d
        proc = self._spawn("deploy.server", [
            "--build", str(build), "--threads", str(d.server_threads), "--max-batch", str(d.max_batch),
            "--max-delay-ms", str(d.max_delay_ms), "--max-queue", str(d.max_queue),
            "--build-store", str(self.root / "builds"), "--variant", role, *self.prediction_log_args(),
            *(extra or [])],
            {"INTENTOPS_API_KEYS": self._secret("internal_key"), "INTENTOPS_API_KEYS_FILE": None,
             # The operator role on the server: reload_stable's hot reloads.
             "INTENTOPS_OPERATOR_KEYS": self._secret("server_operator_key"), "INTENTOPS_OPERATOR_KEYS_FILE": None,
             # A build trained on pseudonymized text masks requests with the same key.
             "INTENTOPS_PSEUDONYM_KEY": (os.environ.get(self.cfg.desensitize.key_env)
                                         if self.cfg.desensitize.mode == "pseudonym" else None)},
            f"server-v{version}-{role}")
        proc |= {"version": str(version), "build": str(build), "role": role, "extra": extra or []}
        self.wait_ready(proc)
        # Cold start: from spawning the process to its first ready answer (a warmed build on
        # local disk: interpreter, imports, ONNX session, PII tables, warm-up batch).
        proc["cold_start_s"] = round(time.time() - proc["started"], 2)
        log.info("model server v%s (%s) ready at %s after %.1f s", version, role, proc["url"],
                 proc["cold_start_s"])
        return proc

    @property
    def prediction_log(self) -> Path:
        """The prediction log every replica of this deployment shares (deploy.predlog)."""
        return self.cfg.lake / "predictions" / "predictions.db"

    def prediction_log_args(self) -> list[str]:
        d = self.d
        if not d.prediction_log:
            return []
        return ["--prediction-log", str(self.prediction_log), "--prediction-log-sample", str(d.prediction_log_sample),
                "--prediction-log-days", str(d.prediction_log_days),
                "--prediction-log-max-rows", str(d.prediction_log_max_rows)]

    # -- replicas of the stable variant ---------------------------------------------------

    @property
    def replicas_file(self) -> Path:
        return self.root / "replicas.json"

    def extras(self) -> list[dict[str, Any]]:
        """The stable variant's extra replicas as recorded (alive or not)."""
        if not self.replicas_file.exists():
            return []
        return json.loads(self.replicas_file.read_text()).get("stable", [])

    def _save_extras(self, extras: list[dict[str, Any]]) -> None:
        tmp = self.replicas_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stable": extras, "updated": time.time()}, indent=2))
        os.replace(tmp, self.replicas_file)
        self._write_targets()

    @contextlib.contextmanager
    def scaling(self):
        """One scale operation at a time per deployment (the autoscaler and a hand-run
        ``intentops deploy scale``)."""
        import fcntl

        with (self.root / "scale.lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def stable_pool(self, state: dict[str, Any] | None = None) -> list[str]:
        """The URLs the router's stable variant should have: the stable server, then the
        live extras of the same version."""
        state = self.state() if state is None else state
        stable = state.get("stable")
        if not stable:
            return []
        return [stable["url"]] + [e["url"] for e in self.extras()
                                  if e.get("version") == stable.get("version") and self.alive(e)]

    def reload_stable(self, build: Path, version: str) -> dict[str, Any]:
        """Hot reload: every stable replica loads ``build`` (in the build store) and swaps
        it in after warm-up, one replica at a time, so the others serve meanwhile and no
        request fails (each server audits its reload)."""
        with self.scaling():
            state = self.state()
            stable = state.get("stable")
            if not stable or not self.alive(stable):
                raise DeployError("no stable server runs: nothing to reload")
            extras = self.extras()
            headers = {"Authorization": f"Bearer {self._secret('server_operator_key')}"}
            done = []
            for proc in [stable, *[e for e in extras if self.alive(e)]]:
                r = httpx.post(f"{proc['url']}/admin/reload", json={"build": str(build)}, headers=headers,
                               timeout=self.d.ready_timeout_seconds)
                if r.status_code != 200:
                    raise DeployError(f"reload of {proc['url']} refused ({r.status_code}): {r.text[:300]}")
                proc |= {"version": str(version), "build": str(build)}
                done.append(proc["url"])
            state["stable"] = stable
            self.save(state)
            self._save_extras(extras)
            return {"reloaded": done, "version": str(version)}

    def drain(self, state: dict[str, Any], proc: dict[str, Any], timeout: float = 30.0) -> None:
        """Stop a replica the router no longer routes to once its requests are done (the
        router lists it as draining until then)."""
        deadline = time.time() + timeout
        while time.time() < deadline and self.alive(state.get("router")):
            try:
                pools = httpx.get(f"{state['router']['url']}/admin/pools", headers=self._admin(), timeout=5).json()
            except (httpx.HTTPError, ValueError):
                break
            busy = [r for group in pools.values() if isinstance(group, list) for r in group
                    if r["url"] == proc["url"] and r["outstanding"] > 0]
            if not busy:
                break
            time.sleep(0.1)
        self.kill(proc)

    def scale(self, replicas: int, reason: str, actor: str | None = None) -> dict[str, Any]:
        """Run ``replicas`` stable replicas in all (the stable server and its extras): new
        ones are started, warmed and then added to the router; removed ones drain first.
        Dead extras and extras of another version (after a promotion) are replaced. Every
        change is an audit record (``scale``)."""
        from core import audit

        if replicas < 1:
            raise DeployError("at least one stable replica")
        with self.scaling():
            state = self.state()
            stable = state.get("stable")
            if not stable or not self.alive(stable):
                raise DeployError("no stable server runs: nothing to scale")
            if not self.alive(state.get("router")):
                raise DeployError("the router is not running")
            before = self.extras()
            keep = [e for e in before if self.alive(e) and e.get("version") == stable["version"]]
            stale = [e for e in before if e not in keep]
            want = replicas - 1
            if len(keep) == want and not stale:
                return {"replicas": replicas, "changed": False}
            audit.check_writable()
            started = []
            try:
                while len(keep) < want:
                    e = self.start_server(Path(stable["build"]), stable["version"], f"stable-r{len(keep) + 1}",
                                          stable.get("extra"))
                    keep.append(e)
                    started.append(e)
            finally:
                self._save_extras(keep + stale)
            removing, keep = keep[want:], keep[:want]
            self._save_extras(keep + removing + stale)
            self.routes(state, stable=[stable["url"]] + [e["url"] for e in keep])
            for e in removing + stale:
                self.drain(state, e)
            self._save_extras(keep)
            outcome = f"{1 + len(before) - len(stale)} -> {replicas} replicas"
            audit.record("scale", f"{self.cfg.training.registered_model} stable v{stable['version']}", outcome,
                         reason, **({"actor_": actor} if actor else {}))
            log.info("scaled stable v%s: %s (%s)", stable["version"], outcome, reason)
            return {"replicas": replicas, "changed": True, "started": [e["url"] for e in started],
                    "stopped": [e["url"] for e in removing + stale],
                    "cold_start_s": [e.get("cold_start_s") for e in started]}

    def port_owner(self, port: int) -> str | None:
        """The other dataset whose running router holds ``port`` (deployments side by side
        under one ``deploy.root``), if any."""
        if not port:
            return None
        for f in sorted(self.root.parent.glob("*/state.json")):
            if f.parent == self.root:
                continue
            with contextlib.suppress(OSError, ValueError):
                router = json.loads(f.read_text()).get("router")
                if router and self.alive(router) and router.get("url", "").rsplit(":", 1)[-1] == str(port):
                    return f.parent.name
        return None

    def ensure_router(self, state: dict[str, Any]) -> dict[str, Any]:
        if self.alive(state.get("router")):
            return state["router"]
        owner = self.port_owner(self.d.router_port)
        if owner is not None:
            raise DeployError(
                f"deploy.router_port {self.d.router_port} is taken by the router of dataset "
                f"{owner!r}; give dataset {self.cfg.dataset!r} its own port (deploy.router_port "
                "in its config file)")
        stable = state.get("stable") if self.alive(state.get("stable")) else None
        # The router may route only to this deployment's servers (their host).
        args = ["--allow-upstream", f"http://{self.d.host}:", "--cache-size", str(self.d.cache_size)] + (
            ["--stable", stable["url"]] if stable else [])
        # A fixed, documented port for clients (router_port 0: any free port, for tests).
        proc = self._spawn("deploy.router", args, {
            "INTENTOPS_API_KEYS_FILE": str(self.client_keys_file), "INTENTOPS_API_KEYS": None,
            "INTENTOPS_UPSTREAM_KEY": self._secret("internal_key"),
            "INTENTOPS_ADMIN_KEYS": self._secret("admin_key"),
            "INTENTOPS_KEY_ADMIN_KEYS": self._secret("key_admin_key")}, "router", port=self.d.router_port)
        state["router"] = proc
        self.save(state)
        # The router is ready once it answers; with no model yet it says 503 on ready.
        deadline = time.time() + 30
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{proc['url']}/health/live", timeout=2).raise_for_status()
                log.info("router at %s (client keys: %s)", proc["url"], self.client_keys_file)
                return proc
            if not self.alive(proc):
                raise DeployError(f"router exited at start; log: {proc['log']}")
            time.sleep(0.2)
        raise DeployError(f"router not answering after 30 s; log: {proc['log']}")

    # -- router admin -------------------------------------------------------------------

    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._secret('admin_key')}"}

    def routes(self, state: dict[str, Any], **upd: Any) -> dict[str, Any]:
        url = state["router"]["url"]
        if upd:
            r = httpx.put(f"{url}/admin/routes", json=upd, headers=self._admin(), timeout=10)
        else:
            r = httpx.get(f"{url}/admin/routes", headers=self._admin(), timeout=10)
        r.raise_for_status()
        return r.json()

    def keys(self, action: str, fingerprint: str | None = None) -> dict[str, Any]:
        """The router's client keys, as the admin role: ``list``, ``create`` (the new key
        is in the answer, once) or ``revoke`` (by fingerprint)."""
        state = self.state()
        if not self.alive(state.get("router")):
            raise DeployError("the router is not running (intentops deploy up)")
        url = f"{state['router']['url']}/admin/keys"
        headers = {"Authorization": f"Bearer {self._secret('key_admin_key')}"}
        if action == "list":
            r = httpx.get(url, headers=headers, timeout=10)
        elif action == "create":
            r = httpx.post(url, headers=headers, timeout=10)
        elif action == "revoke" and fingerprint:
            r = httpx.delete(f"{url}/{fingerprint}", headers=headers, timeout=10)
        else:
            raise DeployError("keys: list, create, or revoke with a fingerprint")
        if r.status_code >= 400:
            raise DeployError(f"keys {action}: router answered {r.status_code}: {r.json().get('detail', r.text)}")
        return r.json()

    def router_stats(self, state: dict[str, Any], since: float) -> dict[str, Any]:
        r = httpx.get(f"{state['router']['url']}/admin/stats", params={"since": since},
                      headers=self._admin(), timeout=10)
        r.raise_for_status()
        return r.json()

    # -- builds from the registry --------------------------------------------------------

    def fetch_build(self, name: str, version: str) -> Path:
        """The version's int8 build, downloaded once into ``builds/v<version>``; refuses a
        version without a build or whose build failed its gate."""
        from export.registry import fetch_int8_build
        from export.runtime import BuildError

        try:
            return fetch_int8_build(self.cfg, name, version)
        except BuildError as exc:
            raise DeployError(str(exc)) from None

    # -- operations ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        state = self.state()
        out: dict[str, Any] = {"root": str(self.root), "client_keys_file": str(self.secrets / "client_keys")}
        for role in ("router", "stable", "canary"):
            p = state.get(role)
            if not p:
                out[role] = None
                continue
            health, own = "down", None
            if self.alive(p):
                try:
                    r = httpx.get(f"{p['url']}/health/ready", timeout=2)
                    health = "ready" if r.status_code == 200 else f"not ready ({r.status_code})"
                    own = r.json().get("cold_start_s") if r.status_code == 200 and role != "router" else None
                except (httpx.HTTPError, ValueError) as exc:
                    health = f"not answering ({type(exc).__name__})"
            out[role] = {k: p.get(k) for k in ("url", "pid", "version", "build", "cold_start_s")} | {
                "health": health, **({"process_cold_start_s": own} if own is not None else {})}
        out["stable_extras"] = [{k: e.get(k) for k in ("url", "pid", "version", "cold_start_s")}
                                | {"running": self.alive(e)} for e in self.extras()]
        out["replicas"] = {"stable": len(self.stable_pool(state)), "min": self.d.autoscale.min_replicas,
                           "max": self.d.autoscale.max_replicas,
                           "autoscaler": "running" if self.alive(state.get("autoscaler")) else "not running"}
        if self.alive(state.get("router")):
            with contextlib.suppress(httpx.HTTPError):
                out["routes"] = self.routes(state)
        with contextlib.suppress(Exception):
            out["aliases"] = self.aliases()
        return out

    def aliases(self) -> dict[str, str]:
        from core import tracking

        rm = tracking.mlflow_client(self.cfg).get_registered_model(self.cfg.training.registered_model)
        return dict(rm.aliases or {})

    def stop(self) -> list[str]:
        state = self.state()
        stopped = []
        if self.alive(state.get("autoscaler")):  # first: it would replace what stops below
            self.kill(state["autoscaler"])
            stopped.append(f"autoscaler (pid {state['autoscaler']['pid']})")
        state["autoscaler"] = None
        for e in self.extras():
            if self.alive(e):
                self.kill(e)
                stopped.append(f"stable replica (pid {e['pid']})")
        self._save_extras([])
        for role in ("canary", "router", "stable"):
            p = state.get(role)
            if self.alive(p):
                self.kill(p)
                stopped.append(f"{role} (pid {p['pid']})")
            state[role] = None
        self.save(state)
        return stopped

    def ensure_stable(self, state: dict[str, Any], name: str) -> dict[str, Any] | None:
        """The stable server as recorded, restarted from its build if it died; or, when
        nothing runs but the registry has a champion, the champion's build."""
        stable = state.get("stable")
        if stable and not self.alive(stable):
            log.warning("stable server v%s is not running; restarting it", stable["version"])
            stable = self.start_server(Path(stable["build"]), stable["version"], "stable", stable.get("extra"))
        elif not stable:
            champ = self.aliases().get(ALIAS_CHAMPION) if self._has_model(name) else None
            if champ:
                try:
                    stable = self.start_server(self.fetch_build(name, champ), champ, "stable")
                except DeployError as exc:
                    log.warning("champion v%s cannot be served (%s); deploying without a stable", champ, exc)
        state["stable"] = stable
        self.save(state)
        if stable and self.alive(state.get("router")):
            self.routes(state, stable=self.stable_pool(state))
        return stable

    def ensure_autoscaler(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """The autoscaler process, when the config allows more than one replica."""
        if self.d.autoscale.max_replicas <= 1:
            return None
        if self.alive(state.get("autoscaler")):
            return state["autoscaler"]
        cfg_file = self.root / "autoscaler-config.json"
        cfg_file.write_text(self.cfg.model_dump_json(indent=2))
        proc = self._spawn("deploy.autoscaler", ["--config", str(cfg_file)], {}, "autoscaler")
        state["autoscaler"] = proc
        self.save(state)
        log.info("autoscaler started (replicas %d..%d, metrics at %s/metrics)", self.d.autoscale.min_replicas,
                 self.d.autoscale.max_replicas, proc["url"])
        return proc

    def _has_model(self, name: str) -> bool:
        from core import tracking

        try:
            tracking.mlflow_client(self.cfg).get_registered_model(name)
            return True
        except Exception:
            return False

    def rollback(self) -> dict[str, Any]:
        """Serve the ``previous`` alias's build now, without a canary, and swap the aliases
        (``champion`` <-> ``previous``), so a second rollback rolls forward again."""
        from core import tracking

        name = self.cfg.training.registered_model
        client = tracking.mlflow_client(self.cfg)
        al = self.aliases()
        prev, champ = al.get(ALIAS_PREVIOUS), al.get(ALIAS_CHAMPION)
        if not prev:
            raise DeployError(f"{name} has no '{ALIAS_PREVIOUS}' version to roll back to")
        from core import audit

        audit.check_writable()
        state = self.state()
        self.ensure_router(state)
        new = self.start_server(self.fetch_build(name, prev), prev, "stable")
        old = state.get("stable")
        self.routes(state, stable=new["url"], canary="", weight=0.0, shadow=0.0)
        state["stable"] = new
        if self.alive(state.get("canary")):
            self.kill(state["canary"])
        state["canary"] = None
        self.save(state)
        self.kill(old)
        why = f"rollback: v{prev} serves again in place of v{champ}"
        tracking.move_alias(client, name, ALIAS_CHAMPION, prev, why)
        from core import pushmetrics

        pushmetrics.champion_promoted(name, prev)
        if champ:
            tracking.move_alias(client, name, ALIAS_PREVIOUS, champ, why)
            client.set_model_version_tag(name, champ, DECISION_TAG, "rolled_back_by_operator")
        audit.record("rollback", f"{name} v{prev}", "done", why)
        log.info("rolled back: v%s serves, champion -> v%s, previous -> v%s", prev, prev, champ)
        return {"serving": prev, "champion": prev, "previous": champ}
