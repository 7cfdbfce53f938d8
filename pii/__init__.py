"""Personal-data detection and masking: the detector, its validators and learned token models.

Modules:

* ``detector``: the entry points (``detect``, ``mask``, ``redact``, ``mask_series``),
  ``Detection``, the type tables and the overlap resolution;
* ``identifiers``: e-mails, IBANs, PRC IDs, cards, SSNs, IPs and phones by pattern and
  validator; ``phones`` (libphonenumber formats, 12-digit cards), ``checksums`` (Luhn,
  IBAN mod 97, ...);
* ``names`` and ``addresses``: the rule-based PERSON and ADDRESS spans; ``casing``: case
  helpers they share;
* ``model``: the PERSON and ADDRESS token models (weights in ``data/``);
* ``pseudonyms``: keyed pseudonyms of masked values;
* ``lines``: line-oriented detection and masking (``intentops pii detect``);
* ``evaluation``: loaders and scoring for the independent evaluation sets.
"""
