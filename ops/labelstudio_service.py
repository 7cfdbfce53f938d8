"""Label Studio as a local service: how `make up` (``ops/services.py``) and the tests'
session fixture start it.

It runs from its own virtual environment, ``.venv-label-studio`` (``make label-studio``,
part of `make up` and `make test-deps`), pinned by ``constraints-label-studio.txt``: its
pins (pyarrow, pytz, Django's stack) clash with the pipeline's. SQLite under
``var/services/label-studio/``, bound to 127.0.0.1:8300, the admin and its API token
generated (``core/labeling_auth.py``) and handed over in the environment (never on the
command line, where ``ps`` shows them). Legacy tokens are enabled for the organization
(plain ``Authorization: Token``); sign-up without an invitation link is off; the version
check and analytics are off (the machine reaches no service of theirs).

The first start migrates the database: measured at about 30 s on the 2-vCPU Intel host
(contended), about 10 s for later starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.config import PROJECT_ROOT
from core.labeling_auth import LabelStudioCredentials

VENV = PROJECT_ROOT / ".venv-label-studio"


def executable() -> Path:
    return Path(os.environ.get("INTENTOPS_LABEL_STUDIO_VENV", str(VENV))) / "bin" / "label-studio"


def command(host: str, port: int, data_dir: Path) -> list[str]:
    return [str(executable()), "start", "--no-browser", "--internal-host", host, "--port", str(port),
            "--data-dir", str(data_dir), "--enable-legacy-api-token", "--log-level", "WARNING"]


def environment(creds: LabelStudioCredentials, data_dir: Path) -> dict[str, str]:
    """Its own small environment: not the pipeline's (PYTHONPATH, MLflow's users)."""
    return {
        "PATH": f"{executable().parent}{os.pathsep}/usr/bin:/bin",
        "HOME": str(data_dir),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir),
        "LABEL_STUDIO_USERNAME": creds.admin_email,
        "LABEL_STUDIO_PASSWORD": creds.admin_password,
        "LABEL_STUDIO_USER_TOKEN": creds.api_token,
        "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",
        "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
        "LATEST_VERSION_CHECK": "false",
        "COLLECT_ANALYTICS": "false",
        "SENTRY_DSN": "",
        "FRONTEND_SENTRY_DSN": "",
    }
