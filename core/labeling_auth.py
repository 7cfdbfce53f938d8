"""Label Studio's credentials: generated, never defaults, kept beside the registry's.

`make up` starts Label Studio with an admin whose password and API token are generated
here and stored under the ``label_studio`` key of the services' credentials file
(``var/services/credentials.json``, mode 0600, the file ``core/registry_auth.py`` keeps
MLflow's users in). The same entry holds the key that pseudonymizes reviewer ids
(HMAC-SHA256): the lake stores ``reviewer:<hash>``, never Label Studio's user id or email.

Clients (the push task, the pull sensor, the tests) find the server and token with
:func:`connection`: ``INTENTOPS_LABEL_STUDIO_URL`` / ``INTENTOPS_LABEL_STUDIO_TOKEN`` in
the environment (compose, another installation), else this file and the service's fixed
local address.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from core.config import PROJECT_ROOT
from core.secretfiles import write_private

ADMIN_EMAIL = "admin@intentops.local"
PORT = 8300  # no other service of `make up` uses it
HOST = "127.0.0.1"
KEY = "label_studio"


def credentials_file() -> Path:
    """The services' credentials file (INTENTOPS_SERVICES_ROOT moves it, as for `up`)."""
    root = os.environ.get("INTENTOPS_SERVICES_ROOT")
    return (Path(root) if root else PROJECT_ROOT / "var" / "services") / "credentials.json"


@dataclass(frozen=True)
class LabelStudioCredentials:
    admin_email: str
    admin_password: str
    api_token: str  # Label Studio's legacy (non-expiring) token of the admin
    reviewer_key: str  # HMAC key of reviewer pseudonyms

    @classmethod
    def generate(cls) -> LabelStudioCredentials:
        return cls(ADMIN_EMAIL, secrets.token_urlsafe(24), secrets.token_hex(20), secrets.token_hex(32))

    @classmethod
    def load(cls, path: Path | None = None) -> LabelStudioCredentials | None:
        path = Path(path or credentials_file())
        if not path.exists():
            return None
        entry = json.loads(path.read_text()).get(KEY)
        return cls(**entry) if entry else None

    @classmethod
    def load_or_create(cls, path: Path | None = None) -> LabelStudioCredentials:
        """The ``label_studio`` entry of ``path``, generated and added on first use; the
        file's other entries are kept, and it stays 0600 (replaced atomically)."""
        path = Path(path or credentials_file())
        path.parent.mkdir(parents=True, exist_ok=True)
        # Two `up`s at once must not generate two different tokens: one writer at a time.
        with open(path.with_name(f".{path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = json.loads(path.read_text()) if path.exists() else {}
            if not data.get(KEY):
                data[KEY] = asdict(cls.generate())
                write_private(path, json.dumps(data, indent=2) + "\n")
        return cls(**data[KEY])


def pseudonym(reviewer: object, key: str) -> str:
    """``reviewer:<16 hex>``: the same reviewer maps to the same id, and the id does not
    reveal who it is without the key."""
    digest = hmac.new(key.encode(), str(reviewer).encode(), hashlib.sha256).hexdigest()[:16]
    return f"reviewer:{digest}"


@dataclass(frozen=True)
class Connection:
    url: str
    token: str
    reviewer_key: str
    source: str  # where it came from, for the logs


def connection(url: str = "", env: dict[str, str] | None = None) -> Connection | None:
    """Where Label Studio is and how to authenticate, or None when none is configured.

    ``url`` (the config's ``labeling.url``) or ``INTENTOPS_LABEL_STUDIO_URL`` with
    ``INTENTOPS_LABEL_STUDIO_TOKEN``; otherwise the entry `make up` wrote."""
    env = os.environ if env is None else env
    creds = LabelStudioCredentials.load()
    url = url or env.get("INTENTOPS_LABEL_STUDIO_URL", "")
    token = env.get("INTENTOPS_LABEL_STUDIO_TOKEN") or (creds.api_token if creds else "")
    key = env.get("INTENTOPS_REVIEWER_KEY") or (creds.reviewer_key if creds else "")
    if url and token and key:
        return Connection(url.rstrip("/"), token, key, "labeling.url / environment")
    if not url and creds:
        return Connection(f"http://{HOST}:{PORT}", creds.api_token, creds.reviewer_key,
                          f"{credentials_file().name} (make up)")
    return None
