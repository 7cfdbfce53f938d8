"""The registry asks who you are: MLflow's basic-auth app on every server the pipeline uses.

Wherever the pipeline talks to an MLflow *server* (``make up``, the compose file, the test
suite's session server) the server runs ``mlflow server --app-name basic-auth`` with:

* an **admin** user whose password is generated here, never a default (MLflow refuses its
  old ``password1234`` too); the admin only creates users and grants permissions;
* the **pipeline** user (``intentops-pipeline``): creates experiments, runs and registered
  models (MLflow gives their creator MANAGE), registers versions and moves aliases;
* the **follower** user (``intentops-follower``): what the champion follower and the
  serving side use; it reads the registry and downloads builds, and nothing else: the
  default permission is READ, so it can follow ``champion`` but a move of ``champion`` it
  attempts is refused (403), as is every request without credentials (401).

The credentials live in one JSON file of mode 0600 (``var/services/credentials.json`` for
``make up``), created once; clients authenticate with MLflow's own variables
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (``client_env``).

The local file store of ``make demo`` (a SQLite file, no server) has no authentication: it
is only reachable by whoever can read the project's folder.

``python -m core.registry_auth provision URL`` creates the two users on a running server
(the compose file's ``mlflow-users`` job), reading the passwords from the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from core.secretfiles import create_private

ADMIN_USER = "admin"
PIPELINE_USER = "intentops-pipeline"
FOLLOWER_USER = "intentops-follower"
DEFAULT_PERMISSION = "READ"


class RegistryAuthError(RuntimeError):
    """The registry's users could not be provisioned; the message says which call failed."""


@dataclass(frozen=True)
class RegistryCredentials:
    admin_password: str
    pipeline_password: str
    follower_password: str
    flask_secret_key: str  # CSRF protection of the auth app's forms

    @classmethod
    def generate(cls) -> RegistryCredentials:
        return cls(*(secrets.token_urlsafe(24) for _ in range(4)))

    @classmethod
    def load_or_create(cls, path: Path) -> RegistryCredentials:
        """The credentials in ``path`` (a JSON file whose ``mlflow`` key holds them),
        generated on first use; the file is created with mode 0600."""
        path = Path(path)
        create_private(path, json.dumps({"mlflow": asdict(cls.generate())}, indent=2) + "\n")
        data = json.loads(path.read_text())
        if "mlflow" not in data:
            raise RegistryAuthError(f"{path} has no 'mlflow' credentials; delete it to generate new ones")
        return cls(**data["mlflow"])

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RegistryCredentials:
        env = os.environ if env is None else env
        names = {"admin_password": "MLFLOW_AUTH_ADMIN_PASSWORD",
                 "pipeline_password": "INTENTOPS_MLFLOW_PIPELINE_PASSWORD",
                 "follower_password": "INTENTOPS_MLFLOW_FOLLOWER_PASSWORD",
                 "flask_secret_key": "MLFLOW_FLASK_SERVER_SECRET_KEY"}
        missing = [v for v in names.values() if not env.get(v)]
        if missing:
            raise RegistryAuthError("missing in the environment: " + ", ".join(missing))
        return cls(**{k: env[v] for k, v in names.items()})

    def password(self, user: str) -> str:
        return {ADMIN_USER: self.admin_password, PIPELINE_USER: self.pipeline_password,
                FOLLOWER_USER: self.follower_password}[user]


COMPOSE_DATABASE_URI = "postgresql+psycopg2://mlflow@postgres:5432/mlflow_auth"  # password: PGPASSWORD


def server_config(database_uri: str) -> str:
    """The auth app's configuration file; no secret in it (the admin password comes from
    ``MLFLOW_AUTH_ADMIN_PASSWORD``). docker/mlflow/basic_auth.ini is this text for
    ``COMPOSE_DATABASE_URI`` (a test keeps the two equal)."""
    return (
        "[mlflow]\n"
        f"default_permission = {DEFAULT_PERMISSION}\n"
        f"database_uri = {database_uri}\n"
        f"admin_username = {ADMIN_USER}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "grant_default_workspace_access = false\n"
        # Each request checks a PBKDF2 hash (hundreds of milliseconds); the pipeline logs
        # many small requests, so a successful check is cached for a minute per worker.
        # A password changed through the API takes effect at once on the worker that
        # handled it and within the minute on the others.
        "auth_cache_ttl_seconds = 60\n")


def write_server_config(folder: Path, database_uri: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    ini = folder / "basic_auth.ini"
    ini.write_text(server_config(database_uri))
    return ini


def server_args() -> list[str]:
    return ["--app-name", "basic-auth"]


def server_env(creds: RegistryCredentials, auth_dir: Path, auth_db: str | None = None) -> dict[str, str]:
    """What ``mlflow server --app-name basic-auth`` needs in its environment; the auth
    database is ``auth_db``, by default a SQLite file in ``auth_dir`` (beside the tracking
    store).

    The server's job execution is off: with it, MLflow 3 starts seven Huey consumer
    processes for its GenAI jobs (scorers, trace roll-ups), which nothing here uses; an
    idle server took 2.5 GB and 4.1 CPU seconds a minute with them, 0.54 GB and 0.1
    without (``benchmarks/mlflow_server.py``, docs/BENCHMARKS.md)."""
    ini = write_server_config(auth_dir, auth_db or f"sqlite:///{Path(auth_dir) / 'basic_auth.db'}")
    return {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_PASSWORD": creds.admin_password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": creds.flask_secret_key,
            # off unless the environment turns it on
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")}


def client_env(creds: RegistryCredentials, user: str = PIPELINE_USER) -> dict[str, str]:
    return {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": creds.password(user)}


def _call(client: httpx.Client, method: str, path: str, **kw) -> httpx.Response:
    r = client.request(method, path, **kw)
    if r.status_code >= 400 and "RESOURCE_ALREADY_EXISTS" not in r.text:
        raise RegistryAuthError(f"{method} {path} answered {r.status_code}: {r.text[:300]}")
    return r


def provision(url: str, creds: RegistryCredentials, timeout: float = 60.0) -> None:
    """Create the pipeline and follower users (idempotent: an existing user gets its
    password reset to the file's) and give the pipeline user MANAGE on every experiment and
    registered model already in the store (a store that ran without authentication before)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url.rstrip("/"), auth=(ADMIN_USER, creds.admin_password),
                      timeout=30) as c:
        while True:  # the server may still be starting
            try:
                if c.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RegistryAuthError(f"MLflow at {url} is not healthy after {timeout:.0f}s")
            time.sleep(1)
        for user in (PIPELINE_USER, FOLLOWER_USER):
            r = c.get("/api/2.0/mlflow/users/get", params={"username": user})
            if r.status_code == 200:
                _call(c, "PATCH", "/api/2.0/mlflow/users/update-password",
                      json={"username": user, "password": creds.password(user)})
            else:
                _call(c, "POST", "/api/2.0/mlflow/users/create",
                      json={"username": user, "password": creds.password(user)})
        _grant_existing(c)


def _grant_existing(c: httpx.Client) -> None:
    for path, method, key, kind, ident in (
            ("/api/2.0/mlflow/experiments/search", "POST", "experiments", "experiment", "experiment_id"),
            ("/api/2.0/mlflow/registered-models/search", "GET", "registered_models", "registered_model", "name")):
        token = None
        while True:
            page = {"max_results": 1000, **({"page_token": token} if token else {})}
            body = _call(c, method, path, **({"json": page} if method == "POST" else {"params": page})).json()
            for item in body.get(key, []):
                # Already granted (a second ``up``) answers RESOURCE_ALREADY_EXISTS: fine.
                _call(c, "POST", "/api/3.0/mlflow/users/permissions/grant",
                      json={"username": PIPELINE_USER, "resource_type": kind,
                            "resource_id": str(item[ident]), "permission": "MANAGE"})
            token = body.get("next_page_token")
            if not token:
                break


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m core.registry_auth", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    prov = sub.add_parser("provision", help="create the pipeline and follower users on a running server; "
                          "passwords from MLFLOW_AUTH_ADMIN_PASSWORD, INTENTOPS_MLFLOW_PIPELINE_PASSWORD, "
                          "INTENTOPS_MLFLOW_FOLLOWER_PASSWORD, MLFLOW_FLASK_SERVER_SECRET_KEY")
    prov.add_argument("url")
    prov.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    try:
        provision(args.url, RegistryCredentials.from_env(), timeout=args.timeout)
    except RegistryAuthError as e:
        print(f"registry users not provisioned: {e}", file=sys.stderr)
        return 1
    print(f"users {PIPELINE_USER} and {FOLLOWER_USER} are ready on {args.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
