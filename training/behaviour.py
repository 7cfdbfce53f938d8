"""Behavioural checks a model must pass before registration (CheckList-style: Ribeiro et
al., 2020): invariance tests and a minimum-functionality table.

* **PII-placeholder invariance**: masked personal data carries no intent. Swapping one
  placeholder for another (``<PERSON>`` -> ``<EMAIL>``) or appending a masked sign-off
  ("Thanks, <PERSON>") must not change the prediction.
* **Casing invariance**: customers write in any case; lower- and upper-casing a message
  must not change the prediction.
* **Minimum functionality**: short, unambiguous messages with one right intent each.

Each check reports its rate and the threshold; a model passes when every check does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

PLACEHOLDER_RE = re.compile(r"<(PERSON|EMAIL|PHONE|CARD|IBAN|US_SSN|PRC_ID|ADDRESS|IP_ADDRESS)>")
SWAP = {"PERSON": "EMAIL", "EMAIL": "PHONE", "PHONE": "PERSON", "CARD": "IBAN", "IBAN": "CARD",
        "US_SSN": "PRC_ID", "PRC_ID": "US_SSN", "ADDRESS": "PERSON", "IP_ADDRESS": "EMAIL"}
SIGN_OFFS = (" Thanks, <PERSON>", " You can reach me at <EMAIL>.", " My number is <PHONE>.")

# Unambiguous messages, one per intent, written for this table (not from Banking77).
MINIMUM_FUNCTIONALITY: tuple[tuple[str, str], ...] = (
    ("I lost my card, please block it", "lost_or_stolen_card"),
    ("How do I activate my new card?", "activate_my_card"),
    ("I want to change my PIN", "change_pin"),
    ("My PIN is blocked after too many attempts", "pin_blocked"),
    ("The ATM kept my card and did not give it back", "card_swallowed"),
    ("Please close my account, I want to leave", "terminate_account"),
    ("How old do I have to be to open an account?", "age_limit"),
    ("Can I add my card to Apple Pay?", "apple_pay_or_google_pay"),
    ("My card has still not arrived in the post", "card_arrival"),
    ("What exchange rate do you use?", "exchange_rate"),
    ("My top-up failed, what happened?", "top_up_failed"),
    ("How long does a transfer take to arrive?", "transfer_timing"),
    ("I forgot my passcode and cannot log in", "passcode_forgotten"),
    ("How can I get a virtual card?", "getting_virtual_card"),
    ("Is your card Visa or Mastercard?", "visa_or_mastercard"),
    ("I was charged twice for the same purchase", "transaction_charged_twice"),
    ("Contactless payments do not work on my card", "contactless_not_working"),
    ("I want to cancel a transfer I just made", "cancel_transfer"),
    ("Which countries do you support?", "country_support"),
    ("My card is about to expire, what do I do?", "card_about_to_expire"),
)


def _rate(before: Sequence[str], after: Sequence[str]) -> float:
    return sum(a == b for a, b in zip(before, after, strict=True)) / max(len(before), 1)


def pii_variants(texts: Sequence[str]) -> list[str]:
    """One variant per text: placeholders swapped when it has any, else a masked sign-off."""
    out = []
    for i, t in enumerate(texts):
        if PLACEHOLDER_RE.search(t):
            out.append(PLACEHOLDER_RE.sub(lambda m: f"<{SWAP[m.group(1)]}>", t))
        else:
            out.append(t.rstrip() + SIGN_OFFS[i % len(SIGN_OFFS)])
    return out


def run_checks(
    predict: Callable[[list[str]], list[str]],
    texts: Sequence[str],
    classes: Sequence[str],
    min_invariance: float = 0.95,
    min_functionality: float = 0.8,
) -> dict[str, Any]:
    """Run every check; ``texts`` is a sample of (masked) test messages."""
    texts = list(texts)
    base = predict(texts)
    checks = []
    for name, variant in (
        ("invariance_pii_placeholders", pii_variants(texts)),
        ("invariance_lowercase", [t.lower() for t in texts]),
        ("invariance_uppercase", [t.upper() for t in texts]),
    ):
        rate = _rate(base, predict(variant))
        checks.append({"name": name, "rate": round(rate, 6), "threshold": min_invariance,
                       "passed": rate >= min_invariance, "items": len(texts)})
    table = [(t, y) for t, y in MINIMUM_FUNCTIONALITY if y in set(classes)]
    if table:
        got = predict([t for t, _ in table])
        rate = _rate([y for _, y in table], got)
        failures = [{"text": t, "expected": y, "got": g} for (t, y), g in zip(table, got, strict=True) if g != y]
        checks.append({"name": "minimum_functionality", "rate": round(rate, 6),
                       "threshold": min_functionality, "passed": rate >= min_functionality,
                       "items": len(table), "failures": failures})
    return {"passed": all(c["passed"] for c in checks), "checks": checks}
