"""The DAG's trigger form, derived from the typed config.

Each exposed setting is one config field; its form entry (type, bounds, choices,
description) is read from that field, so the form cannot drift from the config. A form
field left empty (the default) means "the configured value": the YAML file and the
``INTENTOPS__...`` environment stay the source of truth, and a value typed into the form
overrides them for that run only.

Form names are short aliases of the config keys, in :data:`ALIASES`, the one table that
renames anything (``min_label_alpha`` is ``labelqa.min_alpha``). Unknown names in a
trigger's conf are an error, so a misspelt ``epoch`` fails in ``resolve_config`` instead
of training with the default.

Pure data: no Airflow import here; the DAG wraps each entry in an ``airflow.sdk.Param``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from core.config import PipelineConfig

# form name -> config key, in the form's order
ALIASES: dict[str, str] = {
    "dataset": "dataset",
    "input_path": "input.path",
    "input_format": "input.format",
    "min_chars": "clean.min_chars",
    "max_chars": "clean.max_chars",
    "dedup_threshold": "dedup.threshold",
    "pii_mode": "desensitize.mode",
    "max_duplicate_rate": "validation.max_duplicate_rate",
    "max_residual_pii_rate": "validation.max_residual_pii_rate",
    "min_label_alpha": "labelqa.min_alpha",
    "max_suspect_rate": "labelqa.max_suspect_rate",
    "max_conflict_rate": "labelqa.max_conflict_rate",
    "label_suspects": "labelqa.suspects",
    "review_to_label_studio": "labeling.enabled",
    "review_batch_size": "labeling.batch_size",
    "model": "training.hparams.model",
    "epochs": "training.hparams.epochs",
    "max_steps": "training.hparams.max_steps",
    "learning_rate": "training.hparams.lr",
    "registration_margin": "training.margin",
    "training_priority": "training.priority",
    "canary_steps": "deploy.steps",
    "canary_bake_seconds": "deploy.bake_seconds",
}

_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
           "maxLength", "minItems", "maxItems", "enum", "items", "pattern")


# Not a config field: the YAML file to resolve the run's config from (a dataset's own
# config file), instead of configs/pipeline.yaml.
CONFIG_FILE = "config_file"
CONFIG_FILE_ENTRY: dict[str, Any] = {
    "type": ["null", "string"], "minLength": 1, "default": None,
    "description": "A dataset's config file (YAML, like configs/pipeline.yaml; relative paths are "
                   "relative to the project) to resolve this run's settings from; the fields below "
                   "override it. Empty: configs/pipeline.yaml (or INTENTOPS_CONFIG).",
}


class ParamError(ValueError):
    """A trigger conf names a setting the form does not have, or gives a bad value."""


def field_of(key: str) -> tuple[type[BaseModel], str]:
    """The config model and field name of a dotted key (``training.hparams.lr``)."""
    model: type[BaseModel] = PipelineConfig
    *path, name = key.split(".")
    for part in path:
        if part not in model.model_fields:
            raise KeyError(f"{key}: no config section {part!r}")
        model = model.model_fields[part].annotation  # type: ignore[assignment]
    if name not in model.model_fields:
        raise KeyError(f"{key}: no config field {name!r}")
    return model, name


def field_schema(key: str) -> dict[str, Any]:
    """The JSON schema of one config field, with its default, as pydantic states it."""
    model, name = field_of(key)
    schema = model.model_json_schema()["properties"][name]
    if "anyOf" in schema:  # Optional[...]: one non-null branch, plus null
        branches = [b for b in schema.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise TypeError(f"{key}: cannot derive a form field from {branches}")
        schema = {**branches[0], **schema}
    return schema


def form_entry(alias: str) -> dict[str, Any]:
    """``Param`` keyword arguments for one form field: empty by default (the configured
    value), the field's type made nullable, its bounds and choices, its description."""
    key = ALIASES[alias]
    schema = field_schema(key)
    kind = schema.get("type")
    if kind is None and "enum" in schema:  # Literal[...]: pydantic omits the type of mixed enums
        kind = "string"
    entry: dict[str, Any] = {k: schema[k] for k in _BOUNDS if k in schema}
    entry["type"] = ["null", kind]
    if "enum" in entry:
        entry["enum"] = [None, *entry["enum"]]
    default = schema.get("default")
    what = (schema.get("description") or schema.get("title") or key).rstrip(".")
    entry["description"] = (f"{what}. Config key {key}; empty: the configured value"
                            + (f" (default {default})" if default not in (None, "", [], {}) else "")
                            + ".")
    entry["default"] = None
    return entry


def form() -> dict[str, dict[str, Any]]:
    return {CONFIG_FILE: dict(CONFIG_FILE_ENTRY)} | {alias: form_entry(alias) for alias in ALIASES}


# What started a run, carried in its conf beside the settings and changing none of them:
# the alert receiver (ops/monitoring/receiver.py) puts the alert that triggered a run here.
RUN_INFO = ("trigger_alert",)


def overrides(conf: dict[str, Any]) -> dict[str, Any]:
    """Config overrides (dotted keys) from a run's params: unknown names fail, empty values
    keep the configured value, ``RUN_INFO`` keys are not settings."""
    conf = {k: v for k, v in conf.items() if k not in RUN_INFO}
    unknown = sorted(set(conf) - set(ALIASES) - {CONFIG_FILE})
    if unknown:
        raise ParamError(f"unknown trigger settings {unknown}; the form has "
                         f"{sorted([CONFIG_FILE, *ALIASES])}")
    return {ALIASES[k]: v for k, v in conf.items() if v is not None and k != CONFIG_FILE}
