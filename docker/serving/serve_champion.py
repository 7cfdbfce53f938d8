"""Serve a registry alias's int8 build in a container, and follow the alias when it moves.

    python serve_champion.py [--alias champion] [--host 0.0.0.0] [--port 8100]
                             [--poll-seconds 30] [-- extra deploy.server flags]

The long-lived model server of the scaled-out shape (docker/compose.yaml, service
``model-server``). It

1. waits until the registered model (``INTENTOPS_REGISTERED_MODEL``, default
   ``intentops-banking77``) has the alias and that version's int8 build passed its
   gate: the export stage tags the version with ``intentops.onnx.int8.status`` and
   ``intentops.onnx.int8.model_uri``; a version whose build failed is never served;
2. starts ``python -m deploy.server --model-uri <the build> --host --port ...`` (the server
   downloads the build from MLflow, ``MLFLOW_TRACKING_URI``);
3. polls the alias: when the pipeline's rollout moves it (promotion, or ``intentops deploy
   rollback``), it asks the server to hot-reload the new build (``POST /admin/reload``,
   which loads and warms it beside the old one and then swaps, so no request in flight
   fails). A build that cannot be loaded is refused by the server, which keeps serving the
   one it has.

It exits with the server's exit code and passes SIGTERM/SIGINT on. The server's keys come
from ``INTENTOPS_API_KEYS`` / ``INTENTOPS_API_KEYS_FILE`` as usual; the first one
authorizes the reload calls.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger("intentops.serve_champion")
STATUS_TAG = "intentops.onnx.int8.status"
URI_TAG = "intentops.onnx.int8.model_uri"


def resolve(client: Any, name: str, alias: str) -> tuple[str, str] | None:
    """(version, int8 build URI) of ``name@alias``, or None when there is nothing to serve
    yet (no such model or alias, no build attached, or a build that failed its gate)."""
    try:
        mv = client.get_model_version_by_alias(name, alias)
    except Exception as exc:  # the registry says "not found" with an exception
        log.info("%s@%s not available yet: %s", name, alias, str(exc).splitlines()[0][:200])
        return None
    tags = dict(mv.tags or {})
    status, uri = tags.get(STATUS_TAG), tags.get(URI_TAG)
    if status != "passed" or not uri:
        log.warning("%s v%s (@%s) has no servable int8 build (status %s); not serving it",
                    name, mv.version, alias, status)
        return None
    return str(mv.version), uri


def first_key() -> str:
    """The first operator key the server accepts (what the reload call authenticates with:
    /admin/reload is the operator role's)."""
    keys = [k.strip() for k in os.environ.get("INTENTOPS_OPERATOR_KEYS", "").split(",") if k.strip()]
    if not keys and os.environ.get("INTENTOPS_OPERATOR_KEYS_FILE"):
        with open(os.environ["INTENTOPS_OPERATOR_KEYS_FILE"]) as fh:
            keys = [k.strip() for k in fh if k.strip() and not k.startswith("#")]
    if not keys:
        raise SystemExit("no operator key: set INTENTOPS_OPERATOR_KEYS or INTENTOPS_OPERATOR_KEYS_FILE")
    return keys[0]


def reload(port: int, key: str, uri: str, timeout: float = 600.0) -> tuple[int, str]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/reload", method="POST",
        data=json.dumps({"model_uri": uri}).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()[:300]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]
    except OSError as exc:
        return 0, str(exc)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--alias", default="champion")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--poll-seconds", type=float, default=30.0)
    ap.add_argument("server_args", nargs="*", help="passed to deploy.server (after --)")
    args = ap.parse_args(argv)
    name = os.environ.get("INTENTOPS_REGISTERED_MODEL", "intentops-banking77")
    key = first_key()
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        raise SystemExit("MLFLOW_TRACKING_URI is not set: the builds come from the MLflow registry")
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    current = resolve(client, name, args.alias)
    while current is None and not stop.wait(args.poll_seconds):
        current = resolve(client, name, args.alias)
    if current is None:
        return 0
    log.info("serving %s v%s (@%s): %s", name, current[0], args.alias, current[1])
    server = subprocess.Popen([sys.executable, "-m", "deploy.server", "--model-uri", current[1],
                               "--host", args.host, "--port", str(args.port), *args.server_args])
    refused: tuple[str, str] | None = None
    while server.poll() is None:
        if stop.wait(args.poll_seconds):
            server.send_signal(signal.SIGTERM)
            break
        found = resolve(client, name, args.alias)
        if found and found not in (current, refused):
            status, body = reload(args.port, key, found[1])
            if status == 200:
                log.info("reloaded: v%s -> v%s (%s)", current[0], found[0], body)
                current = found
            else:
                if 400 <= status < 500:  # refused: not tried again until the alias moves
                    refused = found
                log.error("reload of v%s refused (HTTP %s: %s); still serving v%s",
                          found[0], status, body, current[0])
    return server.wait()


if __name__ == "__main__":
    raise SystemExit(main())
