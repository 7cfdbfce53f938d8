"""The compose stack's config check: refuses to start anything while a secret still holds
the example's ``change-me`` value (or is empty). Every other service depends on this one
(``service_completed_successfully``), directly or through the services it needs.

    python docker/config_check.py        # reads the environment compose hands it

Prints the names of the offending variables, never their values; exits 1 when there is any.
Standard library only (it runs in the plain Python image).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

PLACEHOLDER = "change-me"
# Variables compose passes in to be checked (the secrets of docker/.env.example).
CHECKED_PREFIX = "CHECK_"


def problems(env: Mapping[str, str]) -> list[str]:
    """What is wrong with the ``CHECK_<NAME>`` variables, by name."""
    out = []
    for var in sorted(env):
        if not var.startswith(CHECKED_PREFIX):
            continue
        name, value = var[len(CHECKED_PREFIX):], env[var]
        if not value.strip():
            out.append(f"{name} is empty")
        elif PLACEHOLDER in value.lower():
            out.append(f"{name} still holds the example's '{PLACEHOLDER}' value")
    if not any(v.startswith(CHECKED_PREFIX) for v in env):
        out.append("no variable was handed in to check (CHECK_<NAME>): the compose file is broken")
    return out


def main() -> int:
    found = problems(os.environ)
    for p in found:
        print(f"config check: {p}", file=sys.stderr)
    if found:
        print("config check: refusing to start; write fresh secrets with "
              "`python docker/make_env.py > docker/.env`", file=sys.stderr)
        return 1
    print("config check: no placeholder secrets")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
