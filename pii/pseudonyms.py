"""Keyed pseudonyms for masked values: ``pseudonym(entity, value, key)`` is
``<ENTITY_hhhhhhhhhh>``, the first 10 hex digits of HMAC-SHA256 over the entity type and the
value's canonical form (``canonical``), so the same card typed with spaces or dashes, or an
e-mail in any case, gets the same token."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re

from pii.names import _TITLES

_LEADING_TITLE_RE = re.compile(rf"^(?i:{_TITLES})\s+")


def canonical(entity: str, value: str) -> str:
    """The form a pseudonym is computed from, so formatting does not change the token:
    the same card typed with spaces or dashes, an e-mail in any case, map alike."""
    if entity in ("CARD", "PHONE", "US_SSN"):
        return "".join(c for c in value if c.isdigit())
    if entity in ("IBAN", "PRC_ID"):
        return "".join(c for c in value if c.isalnum()).upper()
    if entity == "IP_ADDRESS":
        try:
            return ipaddress.ip_address(value).compressed
        except ValueError:
            return value
    if entity == "PERSON":
        value = _LEADING_TITLE_RE.sub("", value)
    return " ".join(value.casefold().split())


def pseudonym(entity: str, value: str, key: bytes) -> str:
    digest = hmac.new(key, f"{entity}:{canonical(entity, value)}".encode(), hashlib.sha256)
    return f"<{entity}_{digest.hexdigest()[:10]}>"


def key_id(key: bytes | None) -> str | None:
    """A public fingerprint of a pseudonym key: it goes into stage keys and builds (a new key
    means new pseudonyms), so a server can check it holds the key the training data was
    masked with, without the key itself in any manifest."""
    if key is None:
        return None
    return hmac.new(key, b"intentops/key-id", hashlib.sha256).hexdigest()[:16]
