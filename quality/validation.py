"""The data-validation gate: Great Expectations (1.x, pandas) on the desensitized candidates.

What: one expectation suite over the desensitize stage's Parquet output (schema, nulls,
unique ``record_id``, labels in the label set, text length, no residual PII pattern,
duplicate rate of the normalized text, row count) plus a one-row accounting batch
(kept + quarantined + merged + unlabeled == rows_in). ``validate`` writes ``validation_result.json``
(a compact summary) and the GX Data Docs site (``data_docs/index.html``) and returns the
summary; ``check`` raises ``GateFailed`` naming each failed expectation and by how much.
The caller publishes the outputs first and calls ``check`` afterwards, so the report
stays readable when the task fails.

Why: training must not start on data that breaks these invariants, and whoever reads the
failure must see *what* failed without the report itself leaking personal data. So every
expectation runs with a result format that carries counts and percentages only
(``BASIC``, ``partial_unexpected_count=0``, ``exclude_unexpected_values``: no unexpected
values, index lists or rows), exception messages and tracebacks are withheld before the
Data Docs are rendered, the duplicate check runs on a 64-bit hash of the normalized text
rather than the text, and the summary keeps whitelisted numeric fields only.

Great Expectations is imported inside the functions: importing it takes seconds and DAG
files import this module at parse time.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.stage import StageVerdict

__all__ = [
    "ACCOUNTING_KEYS",
    "DOCS_DIR",
    "REQUIRED_COLUMNS",
    "RESULT_FILE",
    "GateFailed",
    "GateThresholds",
    "check",
    "normalized_text_key",
    "validate",
]

REQUIRED_COLUMNS = ("record_id", "text", "label", "created_at")
STRING_COLUMNS = ("text", "label")
ACCOUNTING_KEYS = ("rows_in", "kept", "quarantined", "merged")  # and "unlabeled" (0 when absent)
RESULT_FILE = "validation_result.json"
DOCS_DIR = "data_docs"
SUITE = "training_candidates"
ACCOUNTING_SUITE = "accounting"
# Derived column: hash of the normalized text (the duplicate check never sees the text).
KEY_COLUMN = "normalized_text_hash"

# Counts and percentages only: no partial_unexpected_list / _counts, no unexpected_index_list
# or query, no unexpected rows. (BASIC never computes index lists; SUMMARY and COMPLETE would.)
_RESULT_FORMAT: dict[str, Any] = {
    "result_format": "BASIC",
    "partial_unexpected_count": 0,
    "exclude_unexpected_values": True,
    "include_unexpected_rows": False,
    "return_unexpected_index_query": False,
}
# Result fields that are counts/percentages, hence safe to copy into the summary.
_COUNT_FIELDS = (
    "element_count",
    "missing_count",
    "missing_percent",
    "unexpected_count",
    "unexpected_percent",
)
_WITHHELD = "message withheld by the validation gate (it may quote data values)"
_NON_KEY = re.compile(r"[\W_]+")  # \W is Unicode-aware: keeps what str.isalnum() keeps


@dataclass
class GateThresholds:
    min_chars: int = 2
    max_chars: int = 1000
    # Share of rows whose normalized text (lower-case, punctuation and whitespace
    # collapsed) is not unique, after dedup.
    max_duplicate_rate: float = 0.01
    max_residual_pii_rate: float = 0.0  # share of rows matching any residual-PII pattern
    min_rows: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.min_chars <= self.max_chars:
            raise ValueError(
                f"need 0 <= min_chars <= max_chars, got {self.min_chars}, {self.max_chars}"
            )
        for name in ("max_duplicate_rate", "max_residual_pii_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.min_rows < 0:
            raise ValueError(f"min_rows must be >= 0, got {self.min_rows}")


class GateFailed(StageVerdict):
    """The gate's expectations failed; ``failures`` holds one readable line per failure
    (expectation, column, how many rows and which share; never a data value)."""

    def __init__(self, failures: list[str], evaluated: int | None = None) -> None:
        self.failures = list(failures)
        of = f" of {evaluated}" if evaluated is not None else ""
        lines = [f"validation gate failed: {len(self.failures)}{of} expectations failed"]
        lines += [f"  - {f}" for f in self.failures]
        super().__init__("\n".join(lines))


def check(summary: dict[str, Any]) -> None:
    """Raise ``GateFailed`` when the gate's summary (as returned by ``validate`` or read
    back from ``validation_result.json``) is a failure."""
    if summary.get("success"):
        return
    failures = summary.get("failures") or ["the validation result is marked as failed"]
    raise GateFailed(failures, len(summary.get("expectations", [])) or None)


def normalized_text_key(text):  # pd.Series -> pd.Series[UInt64]
    """64-bit hash of each text's normalized form (lower-case, every run of punctuation,
    underscores and whitespace collapsed to one space, trimmed); <NA> where text is null.

    The text was NFKC-normalized by the clean stage already. 64 bits: the chance of any
    collision among a million texts is about 3e-8."""
    import pandas as pd

    norm = text.astype("string").str.lower().str.replace(_NON_KEY, " ", regex=True).str.strip()
    hashed = pd.util.hash_pandas_object(norm.fillna(""), index=False).to_numpy()
    return pd.Series(pd.array(hashed, dtype="UInt64"), index=text.index).mask(norm.isna())


# --------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class _Check:
    check: str  # stable id of the gate's check, e.g. "residual_pii.EMAIL"
    suite: str
    column: str | None  # the data column the check is about (None: table level)
    needs: tuple[str, ...]  # data columns it reads; skipped when one is missing
    expectation: Any  # a gx Expectation
    what: str  # "outside the label set" ... completes "<n> of <m> rows (<p>%) ..."
    allowed: float | None = None  # share of rows allowed to fail (mostly = 1 - allowed)


def _checks(labels: list[str], patterns: dict[str, str], t: GateThresholds) -> list[_Check]:
    import great_expectations.expectations as gxe

    def mostly(rate: float) -> float:
        return round(1.0 - rate, 12)

    def c(check, column, needs, exp, what, allowed=None, suite=SUITE):
        exp.meta = {"gate_check": check}
        return _Check(check, suite, column, tuple(needs), exp, what, allowed)

    out = [
        c(
            "schema",
            None,
            (),
            gxe.ExpectTableColumnsToMatchSet(column_set=list(REQUIRED_COLUMNS), exact_match=False),
            "missing columns",
        ),
        c("row_count", None, (), gxe.ExpectTableRowCountToBeBetween(min_value=t.min_rows), "rows"),
    ]
    for col in STRING_COLUMNS:
        out.append(
            c(
                f"type.{col}",
                col,
                [col],
                gxe.ExpectColumnValuesToBeOfType(column=col, type_="str"),
                "are not strings",
            )
        )
    for col in ("record_id", "text", "label"):
        out.append(
            c(
                f"not_null.{col}",
                col,
                [col],
                gxe.ExpectColumnValuesToNotBeNull(column=col),
                "are null",
            )
        )
    out += [
        c(
            "unique.record_id",
            "record_id",
            ["record_id"],
            gxe.ExpectColumnValuesToBeUnique(column="record_id"),
            "share their record_id",
        ),
        c(
            "label_set",
            "label",
            ["label"],
            gxe.ExpectColumnValuesToBeInSet(column="label", value_set=sorted(set(labels))),
            "outside the label set",
        ),
        c(
            "length",
            "text",
            ["text"],
            gxe.ExpectColumnValueLengthsToBeBetween(
                column="text", min_value=t.min_chars, max_value=t.max_chars
            ),
            f"shorter than {t.min_chars} or longer than {t.max_chars} characters",
        ),
    ]
    for entity, regex in patterns.items():
        re.compile(regex)  # a broken pattern is a caller bug: fail loudly, not per row
        out.append(
            c(
                f"residual_pii.{entity}",
                "text",
                ["text"],
                gxe.ExpectColumnValuesToNotMatchRegex(
                    column="text", regex=regex, mostly=mostly(t.max_residual_pii_rate)
                ),
                f"match the residual {entity} pattern",
                t.max_residual_pii_rate,
            )
        )
    out += [
        c(
            "duplicate_rate",
            "text",
            ["text"],
            gxe.ExpectColumnValuesToBeUnique(
                column=KEY_COLUMN, mostly=mostly(t.max_duplicate_rate)
            ),
            "share their normalized text with another row",
            t.max_duplicate_rate,
        ),
        c(
            "accounting",
            None,
            (),
            gxe.ExpectColumnPairValuesToBeEqual(
                column_A="kept_plus_quarantined_plus_merged_plus_unlabeled", column_B="rows_in"
            ),
            "accounting",
            suite=ACCOUNTING_SUITE,
        ),
    ]
    return out


# --------------------------------------------------------------------------- running GX


def _gx_context(docs_dir: Path):
    os.environ["GX_ANALYTICS_ENABLED"] = "false"  # before GX is imported
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    # Ephemeral: stores in memory, nothing under the project; only the docs site on disk.
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        data_docs_sites={
            "gate": {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(docs_dir),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        },
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    return gx.get_context(project_config=config, mode="ephemeral")


def _run_suite(context, name: str, checks: list[_Check], frame) -> dict[str, Any]:
    """Validate ``frame`` against the checks' expectations; results by check id."""
    import great_expectations as gx

    batch = (
        context.data_sources.add_pandas(name)
        .add_dataframe_asset(name)
        .add_batch_definition_whole_dataframe("all")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=name))
    for ch in checks:
        suite.add_expectation(ch.expectation)
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=name, data=batch, suite=suite)
    )
    with warnings.catch_warnings():
        # pandas warns that a PII pattern with groups is used as a regex: it is.
        warnings.filterwarnings("ignore", message=".*has match groups", category=UserWarning)
        result = definition.run(batch_parameters={"dataframe": frame}, result_format=_RESULT_FORMAT)
    return {r.expectation_config.meta["gate_check"]: r for r in result.results}


def _exception_name(traceback: str | None) -> str:
    last = (traceback or "").strip().splitlines()[-1:] or [""]
    m = re.match(r"([A-Za-z_][\w.]*)(?::|$)", last[0])
    return m.group(1) if m else "Exception"


def _scrub_info(info: dict) -> tuple[dict, list[str]]:
    """Exception info with messages and tracebacks withheld (a message can quote a data
    value; a traceback names machine paths); returns the exception type names."""
    if "raised_exception" in info:
        if not info.get("raised_exception"):
            return info, []
        name = _exception_name(info.get("exception_traceback"))
        return {
            "raised_exception": True,
            "exception_message": f"{name}: {_WITHHELD}",
            "exception_traceback": f"{name}: {_WITHHELD}",
        }, [name]
    names: list[str] = []
    out = {}
    for key, sub in info.items():
        out[key], n = _scrub_info(sub) if isinstance(sub, dict) else (sub, [])
        names += n
    return out, names


def _scrub_store(context) -> dict[str, str]:
    """Withhold exception messages in every stored validation result (the Data Docs are
    rendered from the store); returns {gate_check: exception type} of those that raised."""
    store = context.validation_results_store
    raised: dict[str, str] = {}
    for key in store.list_keys():
        suite_result = store.get(key)
        changed = False
        for r in suite_result.results:
            if not r.exception_info:
                continue
            r.exception_info, names = _scrub_info(dict(r.exception_info))
            if names:
                changed = True
                raised[r.expectation_config.meta.get("gate_check", "?")] = names[0]
        if changed:
            store.set(key, suite_result)
    return raised


# --------------------------------------------------------------------------- summary


def _plain(v: Any) -> Any:
    """JSON-safe plain Python value (numpy scalars, NaN)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set):
        return [_plain(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, str | bytes):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _pct(x: float) -> str:
    return f"{x:.2g}%" if 0 < x < 0.01 else f"{x:.2f}%"


def _summary_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in kwargs.items() if k != "batch_id"}
    if "value_set" in out:  # the label set: configuration, but long; keep its size
        out["value_set_size"] = len(out.pop("value_set"))
    return _plain(out)


def _entry(ch: _Check, r, raised: dict[str, str]) -> dict[str, Any]:
    cfg = r.expectation_config
    res = dict(r.result or {})
    entry: dict[str, Any] = {
        "check": ch.check,
        "suite": ch.suite,
        "type": cfg.type,
        "column": ch.column,
        "kwargs": _summary_kwargs(dict(cfg.kwargs)),
        "success": bool(r.success),
    }
    entry.update({k: _plain(res[k]) for k in _COUNT_FIELDS if k in res})
    # Observed values only where they are not data: row count, column names, a dtype name.
    if ch.check in ("row_count", "schema") or (
        ch.check.startswith("type.") and "observed_value" in res
    ):
        entry["observed_value"] = _plain(res.get("observed_value"))
    if ch.check == "schema":
        entry["missing_columns"] = sorted(
            _plain(((res.get("details") or {}).get("mismatched") or {}).get("missing") or [])
        )
    if ch.allowed is not None:
        entry["allowed_percent"] = round(ch.allowed * 100, 10)
    if ch.check in raised:
        entry["error"] = raised[ch.check]
    return entry


def _failure(ch: _Check, e: dict[str, Any], accounting: dict[str, int], t: GateThresholds) -> str:
    name = f"{e['type']}({e['column']})" if e["column"] else e["type"]
    if ch.check == "duplicate_rate":
        name = f"{e['type']}(normalized text)"
    elif ch.check.startswith("residual_pii."):
        name = f"{e['type']}({e['column']}, {ch.check.split('.', 1)[1]})"
    if "error" in e:
        return f"{name}: could not be evaluated ({e['error']})"
    if ch.check == "schema":
        return f"{name}: missing required column(s): {', '.join(e['missing_columns'])}"
    if ch.check == "row_count":
        return f"{name}: {e.get('observed_value')} rows < min_rows {t.min_rows}"
    if ch.check == "accounting":
        a = accounting
        total = a["kept"] + a["quarantined"] + a["merged"] + a.get("unlabeled", 0)
        return (
            f"accounting ({e['type']}): kept {a['kept']} + quarantined {a['quarantined']}"
            f" + merged {a['merged']} + unlabeled {a.get('unlabeled', 0)} = {total} != rows_in {a['rows_in']}"
        )
    if ch.check.startswith("type.") and "unexpected_count" not in e:
        return f"{name}: column type is {e.get('observed_value')}, expected str"
    n = int(e.get("element_count") or 0)
    missing = int(e.get("missing_count") or 0)
    u = int(e.get("unexpected_count") or 0)
    rows = f"{n - missing} non-null rows" if missing else f"{n} rows"
    pct = e.get("unexpected_percent")
    pct = float(pct) if pct is not None else (100.0 * u / n if n else 0.0)
    msg = f"{name}: {u} of {rows} ({_pct(pct)}) {ch.what}"
    if ch.allowed is not None:
        msg += f"; allowed at most {_pct(ch.allowed * 100)}"
    return msg


def _inject_index_summary(index: Path, summary: dict[str, Any]) -> None:
    """Put a static table of the gate's expectations at the top of the Data Docs index.

    GX's own index lists suites and runs (through JavaScript loaded from a CDN, so it is
    empty offline); this table names each expectation, its outcome and its counts."""
    esc = html.escape
    rows = []
    for e in summary["expectations"]:
        if e["success"]:
            detail = ""
            if "unexpected_count" in e:
                detail = f"{e['unexpected_count']} of {e.get('element_count')} rows unexpected"
            elif e.get("observed_value") is not None and e["check"] == "row_count":
                detail = f"{e['observed_value']} rows"
        else:
            detail = e.get("message", "failed")
        status = "passed" if e["success"] else "FAILED"
        rows.append(
            f"<tr><td>{esc(e['check'])}</td><td><code>{esc(e['type'])}</code></td>"
            f"<td>{esc(str(e['column'] or ''))}</td><td>{status}</td><td>{esc(detail)}</td></tr>"
        )
    for s in summary["skipped"]:
        rows.append(
            f"<tr><td>{esc(s['check'])}</td><td><code>{esc(s['type'])}</code></td>"
            f"<td>{esc(str(s['column'] or ''))}</td><td>skipped</td>"
            f"<td>{esc(s['reason'])}</td></tr>"
        )
    verdict = "PASSED" if summary["success"] else "FAILED"
    section = (
        '<section id="validation-gate-summary" style="padding:1rem 3rem">'
        f"<h2>Validation gate: {verdict}</h2>"
        f"<p>{summary['row_count']} rows; counts and percentages only (no data values).</p>"
        '<table class="table table-sm table-bordered"><thead><tr><th>Check</th>'
        "<th>Expectation</th><th>Column</th><th>Result</th><th>Detail</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )
    page = index.read_text(encoding="utf-8")
    m = re.search(r"<body[^>]*>", page)
    page = (page[: m.end()] + section + page[m.end() :]) if m else page + section
    index.write_text(page, encoding="utf-8")


# --------------------------------------------------------------------------- entry point


def _load(data_dir: Path):
    import pandas as pd
    import pyarrow.dataset as ds

    if not data_dir.is_dir():
        raise FileNotFoundError(f"no Parquet directory at {data_dir}")
    columns = list(ds.dataset(str(data_dir), format="parquet").schema.names)
    # Only the columns the gate reads: extra ones (annotations: lists of structs) cost
    # memory and time in pandas and are not checked.
    wanted = [c for c in REQUIRED_COLUMNS if c in columns]
    frame = pd.read_parquet(data_dir, columns=wanted) if wanted else pd.DataFrame()
    return frame.reset_index(drop=True), columns


def validate(
    data_dir: str | Path,
    out_dir: str | Path,
    *,
    labels: list[str],
    accounting: dict[str, int],
    residual_patterns: dict[str, str],
    thresholds: GateThresholds,
) -> dict[str, Any]:
    """Run the gate on the Parquet directory ``data_dir``; write ``validation_result.json``
    and the Data Docs (``data_docs/index.html``) into ``out_dir``; return the summary.

    Does not raise on failed expectations (call ``check`` after publishing the outputs).
    Expectations on a required column that is missing are skipped and listed under
    ``skipped``; the schema expectation fails for it."""
    import pandas as pd

    data_dir, out_dir = Path(data_dir), Path(out_dir)
    missing_keys = [k for k in ACCOUNTING_KEYS if k not in accounting]
    if missing_keys:
        raise ValueError(f"accounting lacks {missing_keys}; needs {list(ACCOUNTING_KEYS)}")
    acc = {k: int(accounting[k]) for k in ACCOUNTING_KEYS} | {"unlabeled": int(accounting.get("unlabeled") or 0)}
    checks = _checks(labels, residual_patterns, thresholds)

    frame, columns = _load(data_dir)
    if "text" in frame.columns:
        frame[KEY_COLUMN] = normalized_text_key(frame["text"])
    acc_frame = pd.DataFrame(
        [
            {
                **acc,
                "kept_plus_quarantined_plus_merged_plus_unlabeled": acc["kept"]
                + acc["quarantined"]
                + acc["merged"]
                + acc.get("unlabeled", 0),
            }
        ]
    )

    run = [ch for ch in checks if all(c in frame.columns for c in ch.needs)]
    ran = {ch.check for ch in run}
    skipped = [
        {
            "check": ch.check,
            "type": ch.expectation.expectation_type,
            "column": ch.column,
            "reason": "required column missing",
        }
        for ch in checks
        if ch.check not in ran
    ]

    out_dir.mkdir(parents=True, exist_ok=True)
    docs = out_dir / DOCS_DIR
    context = _gx_context(docs)
    results = _run_suite(context, SUITE, [c for c in run if c.suite == SUITE], frame)
    results.update(
        _run_suite(
            context, ACCOUNTING_SUITE, [c for c in run if c.suite == ACCOUNTING_SUITE], acc_frame
        )
    )
    raised = _scrub_store(context)
    context.build_data_docs()

    entries, failures = [], []
    for ch in run:
        e = _entry(ch, results[ch.check], raised)
        if not e["success"]:
            e["message"] = _failure(ch, e, acc, thresholds)
            failures.append(e["message"])
        entries.append(e)

    import great_expectations as gx

    summary = {
        "success": not failures,
        "row_count": len(frame),
        "columns": columns,
        "thresholds": asdict(thresholds),
        "accounting": acc,
        "residual_patterns": sorted(residual_patterns),
        "expectations": entries,
        "skipped": skipped,
        "failures": failures,
        "data_docs": f"{DOCS_DIR}/index.html",
        "great_expectations_version": gx.__version__,
    }
    _inject_index_summary(docs / "index.html", summary)
    (out_dir / RESULT_FILE).write_text(
        json.dumps(_plain(summary), indent=2) + "\n", encoding="utf-8"
    )
    return summary
