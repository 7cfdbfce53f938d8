"""Write docker/.env from docker/.env.example with a fresh random secret for every value
that reads ``change-me`` (the Airflow Fernet key in its own format). Prints to stdout:

    python docker/make_env.py > docker/.env

Secrets are URL-safe (they end up inside database and broker URLs).
"""

from __future__ import annotations

import base64
import secrets
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent / ".env.example"
PLACEHOLDER = "change-me"


def secret_for(name: str) -> str:
    if name == "AIRFLOW_FERNET_KEY":  # 32 bytes, url-safe base64: what cryptography.fernet wants
        return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
    return secrets.token_hex(24)


def render(example: str) -> str:
    out = []
    for line in example.splitlines():
        name, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#") and value.startswith(PLACEHOLDER):
            line = f"{name}={secret_for(name.strip())}"
        out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.write(render(EXAMPLE.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
