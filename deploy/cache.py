"""The router's response cache: repeated questions answered without a model call.

One bounded LRU per variant (stable, canary), so a canary's answers never come from
stable's entries and the canary analysis sees its own traffic. An entry's key is the
variant's model version and the SHA-256 of the request text *after* the model's own
preprocessing (normalization and PII masking, ``contract.preprocess``, the spec the
replica reports on ``/health/ready``): the cache never holds raw text, nor a hash of it
(a hash of an unmasked card number could be brute-forced back), and two messages that
differ only in the personal data they carry share an entry, as they share an answer.
The value is the model server's answer body (labels, scores, version: no text).

A variant's entries are dropped when its model version changes (a reload or a promotion),
and when its preprocessing cannot be reproduced here (another detector version, a
pseudonym key the router lacks) the variant is simply not cached. Only single-text
requests (``{"text": ...}``) are cached.

Written by hand: the key must be computed from the model's own preprocessing, per variant
and version, inside the router's event loop; a generic HTTP cache (Varnish, NGINX) keys on
the raw body.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
from typing import Any

log = logging.getLogger("intentops.router.cache")
VARIANTS = ("stable", "canary")


class ResponseCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: dict[str, collections.OrderedDict[str, bytes]] = {v: collections.OrderedDict() for v in VARIANTS}
        self.version: dict[str, str | None] = dict.fromkeys(VARIANTS)
        self.preprocess: dict[str, Any] = dict.fromkeys(VARIANTS)
        self.spec: dict[str, dict | None] = dict.fromkeys(VARIANTS)
        self.off_reason: dict[str, str | None] = {v: "no replica has reported its preprocessing yet" for v in VARIANTS}

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def configure(self, variant: str, version: str | None, spec: dict | None) -> None:
        """What the variant's replicas report: its model version and preprocessing spec.
        A new version empties the variant's entries."""
        if not self.enabled:
            return
        if version != self.version[variant]:
            if self.entries[variant]:
                log.info("cache of %s emptied: version %s -> %s", variant, self.version[variant], version)
            self.entries[variant].clear()
            self.version[variant] = version
        if spec == self.spec[variant]:
            return
        self.spec[variant] = spec
        self.preprocess[variant] = None
        if not spec:
            self.off_reason[variant] = "the build reports no preprocessing"
            return
        from contract.preprocess import PreprocessingError, Preprocessor

        key = os.environ.get("INTENTOPS_PSEUDONYM_KEY", "").encode() or None
        try:
            self.preprocess[variant] = Preprocessor(spec, key=key)
            self.off_reason[variant] = None
        except PreprocessingError as exc:
            self.off_reason[variant] = str(exc)
            log.warning("no cache for %s: %s", variant, exc)

    def clear(self, variant: str) -> None:
        self.entries[variant].clear()

    def key(self, variant: str, text: str) -> str | None:
        pre = self.preprocess[variant]
        if pre is None or self.version[variant] is None:
            return None
        digest = hashlib.sha256(pre(text).encode("utf-8", "surrogatepass")).hexdigest()
        return f"{self.version[variant]}:{digest}"

    def get(self, variant: str, key: str) -> bytes | None:
        entries = self.entries[variant]
        value = entries.get(key)
        if value is not None:
            entries.move_to_end(key)
        return value

    def put(self, variant: str, key: str, value: bytes) -> None:
        import json

        version = self.version[variant]
        try:
            doc = json.loads(value)
            answered_by = str(doc.get("model_version"))
        except (ValueError, AttributeError):
            return
        if not key.startswith(f"{version}:") or answered_by != version:
            return  # answered by a version that is not (or no longer) the variant's
        # A prediction id names one logged prediction: a cached answer gets none (feedback
        # goes to predictions the model made, not to replays of them).
        if any(p.get("prediction_id") for p in doc.get("predictions", [])):
            for p in doc["predictions"]:
                p["prediction_id"] = None
            value = json.dumps(doc, separators=(",", ":")).encode()
        entries = self.entries[variant]
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > self.size:
            entries.popitem(last=False)

    def view(self) -> dict[str, Any]:
        return {"size": self.size, **{v: {"entries": len(self.entries[v]), "version": self.version[v],
                                          "off": self.off_reason[v]} for v in VARIANTS}}
