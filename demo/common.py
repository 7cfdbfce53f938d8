"""What every part of the raw-data builder shares: the vocabulary of what gets planted
(columns, channels, duplicate/defect/noise/PII kinds and their weights), the thresholds the
planted rows are held to, the invariant check and the seeded random streams.

The streams are keyed by seed and a name or number, so each module draws from its own
stream and a build stays byte-identical for a seed however the code is arranged.
"""

from __future__ import annotations

import random

import numpy as np

COLUMNS = ("ticket_id", "created_at", "channel", "message", "intent", "annotations")
CHANNELS = ("email", "chat", "app", "phone_transcript")
CHANNEL_P = (0.30, 0.35, 0.25, 0.10)
EPOCH = np.datetime64("2026-11-01T00:00:00", "s")
WINDOW_S = 7 * 86400

EXACT_KINDS = ("exact", "case", "punct", "whitespace")
NEAR_KINDS = ("word_swap", "clause_added")
DEFECT_KINDS = (
    "empty_text",
    "whitespace_text",
    "missing_label",
    "unknown_label",
    "control_chars",
    "mojibake",
    "too_long",
    "malformed_record",
)
# label_variant is half of the noise so that ~2.5% of clean rows carry a label spelled the
# way CRMs export it ("Card Arrival"); the four text kinds share the other half.
NOISE_WEIGHTS = {
    "nbsp": 0.125,
    "zero_width": 0.125,
    "fullwidth": 0.125,
    "tabs": 0.125,
    "label_variant": 0.5,
}
NOISE_KINDS = tuple(NOISE_WEIGHTS)
PII_WEIGHTS = {
    "person_name": 0.22,
    "email": 0.14,
    "phone": 0.14,
    "card_number": 0.10,
    "iban": 0.09,
    "us_ssn": 0.06,
    "prc_id": 0.06,
    "street_address": 0.11,
    "ip_address": 0.08,
}
PII_TYPES = tuple(PII_WEIGHTS)
DECOY_TYPES = ("decoy_card", "decoy_iban", "decoy_ssn", "decoy_prc_id")
UNKNOWN_LABELS = (
    "refund_status_xyz",
    "card_arival",
    "general_enquiry",
    "complaint",
    "account_closure_request",
    "other",
)

NEAR_DUP_J = 0.8  # the dedup threshold: originals must stay below it pairwise
MAX_CLEAN_CHARS = 990
TOO_LONG_CHARS = 1500
HARMLESS_SHARE = 0.05  # originals with plain amounts/dates/refs (not recorded as spans)


def _check(cond: bool, msg: str) -> None:
    # Builder invariants are checked with an explicit raise so that `python -O` keeps them.
    if not cond:
        raise AssertionError(msg)


def _py_rng(seed: int, stream: str) -> random.Random:
    # A string seed is hashed with SHA-512 by random.seed: stable across processes.
    return random.Random(f"intentops-rawdata:{seed}:{stream}")


def _np_rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])
