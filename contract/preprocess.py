"""One preprocessing for training and serving: the clean stage's text normalization, then the
desensitize stage's PII masking (same detector, same placeholders or keyed pseudonyms).

``spec`` is what a build records; ``Preprocessor`` applies it to a request's text. The
recorded ``version`` is the code version of this module's import closure (the
normalization, the detector, its validators and its model weights in ``pii/data``): a
server whose detector differs from the one that masked the training data refuses the build
unless told to accept the drift, because the model would be served text masked in a way it
never saw.

Cost per text (Banking77 test messages, one core): 0.04 ms on average, against about
1.3 ms of model CPU per row in a batch (docs/BENCHMARKS.md, issue 22).
"""

from __future__ import annotations

import functools
from typing import Any

from pii.detector import mask
from pii.pseudonyms import key_id
from textnorm import normalize_text

NORMALIZATION = "nfkc, invisible characters removed, whitespace collapsed (textnorm.normalize_text)"


# One message down each of the detector's paths (names, addresses, phones, identifiers):
# their tables and token models load on first use, 0.5 s in all, which would otherwise
# land on the first requests a fresh server answers.
WARM_UP = ("my card has not arrived", "my name is John Smith", "hi i am sarah and my card is lost",
           "i live at 12 baker street london", "call me on 07700 900123 or +44 20 7946 0958",
           "mail john.smith@example.com, iban DE89 3704 0044 0532 0130 00, card 4111 1111 1111 1111")


class PreprocessingError(ValueError):
    """A build's recorded preprocessing that this process cannot apply exactly."""


@functools.cache
def version() -> str:
    from core.codeversion import code_version

    return code_version(__name__)


def spec(mode: str, pseudonym_key_id: str | None) -> dict[str, Any]:
    """The record a build carries of how its training text was prepared."""
    if mode not in ("placeholder", "pseudonym"):
        raise PreprocessingError(f"unknown masking mode {mode!r}")
    return {"normalization": NORMALIZATION, "pii_mode": mode, "pii_key_id": pseudonym_key_id,
            "version": version()}


class Preprocessor:
    """Normalize, then mask, exactly as the training data was."""

    def __init__(self, recorded: dict[str, Any] | None, key: bytes | None = None,
                 allow_version_drift: bool = False) -> None:
        if not recorded:
            raise PreprocessingError(
                "the build records no text preprocessing (text_preprocessing in "
                "preprocessing.json): it was exported before requests were masked like the "
                "training data; re-run the export for this model version")
        self.mode = recorded.get("pii_mode")
        if self.mode not in ("placeholder", "pseudonym"):
            raise PreprocessingError(f"the build's masking mode {self.mode!r} is unknown")
        self.drift = recorded.get("version") != version()
        if self.drift and not allow_version_drift:
            raise PreprocessingError(
                f"the build's training text was prepared by preprocessing version "
                f"{recorded.get('version')}, this server has {version()} (a different PII "
                "detector or normalization): requests would be masked differently from the "
                "training data. Retrain with this code, or start the server with "
                "--allow-preprocessing-drift to accept it")
        if self.mode == "pseudonym":
            if key is None:
                raise PreprocessingError(
                    "the build's training text was pseudonymized with a keyed HMAC; the server "
                    "needs the same key (INTENTOPS_PSEUDONYM_KEY) to mask requests alike")
            if key_id(key) != recorded.get("pii_key_id"):
                raise PreprocessingError(
                    "the pseudonym key given to the server is not the key the training text "
                    f"was masked with (key id {key_id(key)}, the build's {recorded.get('pii_key_id')})")
        self.key = key
        self.recorded = dict(recorded)
        for text in WARM_UP:  # the detector loads its tables and models on first use
            self(text)

    def __call__(self, text: str) -> str:
        return mask(normalize_text(text), self.mode, self.key)[0]
