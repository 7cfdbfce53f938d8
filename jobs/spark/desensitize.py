"""Desensitize stage: detect personal data in every message and mask it.

Input: the dedup stage's ``kept/`` (training candidates) and ``merged/`` (duplicates,
whose votes label QA reads): both carry message text, so both are masked. Output:

* ``kept/``, ``merged/``  the same rows and columns, ``text`` masked, plus ``pii_entities``
                          (the entity types found, in order) — nothing else changes;
* ``unlabeled/``          likewise, for the rows without a label dedup passed on (when
                          ``clean.unlabeled`` is ``review``);
* ``report.json``         counts by entity type and a few *masked* samples per type.

Nothing downstream of this stage reads unmasked text: label QA, training, export and
serving read these outputs only, and the report holds no raw value.

Masking (``desensitize.mode``): typed placeholders (``<EMAIL>``) or keyed pseudonyms
(``<EMAIL_3f9a1c2b7d>``, HMAC-SHA256 under a key read from the environment variable named
by ``desensitize.key_env``; the DAG fills it from the Airflow connection
``intentops_pseudonym``). Detection rules, validators and token models live in the ``pii`` package.

Run by hand:  spark-submit jobs/spark/desensitize.py --run-id RUN   (after dedup ran)
or:           intentops desensitize --run-id RUN
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file by spark-submit
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core import stage, stages
from core.config import DesensitizeConfig, PipelineConfig
from jobs.spark import common
from pii import detector as pii
from pii.pseudonyms import key_id

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame

STAGE = "desensitize"
PARTS = ("kept", "merged")
OPTIONAL_PARTS = ("unlabeled",)  # rows without a label (clean.unlabeled: review)


def pseudonym_key(cfg: DesensitizeConfig, key: str | None = None) -> bytes | None:
    """The HMAC key for pseudonym mode (``key``, else the environment); None in placeholder
    mode.

    Fails before any work is done when the key is missing, saying how to set it."""
    if cfg.mode != "pseudonym":
        return None
    key = key if key is not None else os.environ.get(cfg.key_env, "")
    if len(key) < 16:
        raise stage.StageError(
            f"desensitize.mode=pseudonym needs a secret key of at least 16 characters in the "
            f"environment variable {cfg.key_env} (under Airflow: create the connection "
            f"'intentops_pseudonym' with the key as its password, e.g. "
            f"`airflow connections add intentops_pseudonym --conn-type generic "
            f'--conn-password "$(openssl rand -hex 32)"`). Keys never go in config files.'
        )
    return key.encode("utf-8")


def mask_fn(mode: str, key: bytes | None, text_idx: int):
    """``mapInArrow`` function over every row: ``text`` masked, ``pii_entities`` (the
    entity types found) appended; every other column passes through untouched.

    Why a vectorized UDF: the checksum validators (Luhn, IBAN mod 97, MOD 11-2), the name
    and address token models, libphonenumber and overlap resolution have no Spark
    equivalent."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            masked = pii.mask_series(batch.column(text_idx).to_pandas(), mode=mode, key=key)
            arrays = list(batch.columns)
            arrays[text_idx] = pa.array(masked["text"].tolist(), pa.string())
            entities = pa.array([_as_list(v) for v in masked["entities"]], pa.list_(pa.string()))
            yield pa.RecordBatch.from_arrays(
                [*arrays, entities], names=[*batch.schema.names, "pii_entities"]
            )

    return fn


def _as_list(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return list(json.loads(v)) if v.startswith("[") else ([v] if v else [])
    return [str(x) for x in v]


def desensitize_frame(df: DataFrame, mode: str, key: bytes | None) -> DataFrame:
    """Mask ``text`` in ``df``; adds ``pii_entities`` (array<string>)."""
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType

    # Every row goes through the detector: a bare lower-case name ("text bob the code")
    # matches no pattern a JVM prefilter could test, and the detector's own gates skip
    # the work on rows that cannot hold a detection.
    schema = StructType([*df.schema.fields, StructField("pii_entities", ArrayType(StringType()))])
    return df.mapInArrow(mask_fn(mode, key, df.columns.index("text")), schema)


def parts_of(folder: Path) -> tuple[str, ...]:
    """The parts an upstream output holds: always kept and merged, unlabeled when present."""
    return PARTS + tuple(p for p in OPTIONAL_PARTS if (Path(folder) / p).exists())


def report(session, out: Path, samples_per_type: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    by_part: dict[str, Any] = {}
    totals: dict[str, int] = {}
    samples: dict[str, list[str]] = {}
    for part in parts_of(out):
        df = session.read.parquet(str(out / part))
        rows = df.count()
        with_pii = df.where(F.size("pii_entities") > 0).count()
        counts = {
            r["entity"]: r["count"]
            for r in df.select(F.explode("pii_entities").alias("entity"))
            .groupBy("entity")
            .count()
            .collect()
        }
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
        by_part[part] = {"rows": rows, "rows_with_pii": with_pii, "entities": counts}
        if part == "kept" and samples_per_type:
            for entity in sorted(counts):
                picked = (
                    df.where(F.array_contains("pii_entities", entity))
                    .orderBy("record_id")
                    .select("text")
                    .limit(samples_per_type)
                    .collect()
                )
                samples[entity] = [r["text"] for r in picked]
    return {"parts": by_part, "entities": dict(sorted(totals.items())), "masked_samples": samples}


def run(cfg: PipelineConfig, run_id: str, spark=None, dedup_output: str | None = None):
    key = pseudonym_key(cfg.desensitize)  # first: a missing key fails before any work
    src = (
        Path(dedup_output) if dedup_output else Path(stage.upstream(cfg.lake, run_id, "dedup").path)
    )
    upstream_manifest = stage.read_manifest(src)
    inputs = {"dedup": {"key": upstream_manifest["key"]}}
    stage_cfg = {
        "desensitize": cfg.desensitize.model_dump(exclude={"key_env"}),
        "key_id": key_id(key),
    }

    def work(out: Path) -> dict[str, Any]:
        session = spark or common.get_spark(cfg, "intentops-desensitize")
        rows_in = {}
        for part in parts_of(src):
            df = session.read.parquet(str(src / part))
            rows_in[part] = df.count()
            desensitize_frame(df, cfg.desensitize.mode, key).write.parquet(str(out / part))
        rep = report(session, out, cfg.desensitize.samples_per_type)
        for part in rows_in:
            if rep["parts"][part]["rows"] != rows_in[part]:
                raise AssertionError(
                    f"row accounting broken in {part}: {rep['parts'][part]['rows']} != {rows_in[part]}"
                )
        (out / "report.json").write_text(json.dumps(rep, indent=2, sort_keys=True))
        return {
            "rows_in": sum(rows_in.values()),
            "kept": rows_in["kept"],
            "merged": rows_in["merged"],
            "unlabeled": rows_in.get("unlabeled"),
            "rows_with_pii": sum(p["rows_with_pii"] for p in rep["parts"].values()),
            "entities": rep["entities"],
            "mode": cfg.desensitize.mode,
        }

    return stage.run_stage(STAGE, cfg.lake, inputs, stage_cfg, stages.code_version(STAGE), work, run_id)


def main(argv: list[str] | None = None) -> None:
    def go(args):
        if not args.run_id:
            raise stage.StageError(
                "--run-id is required: desensitize reads that run's dedup output"
            )
        return run(common.config_from_args(args), run_id=args.run_id)

    common.run_main(go, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
