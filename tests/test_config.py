"""Config resolution: defaults < YAML < environment < explicit overrides."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.config import load_config


def test_defaults_from_repo_yaml():
    cfg = load_config(env={})
    assert cfg.dedup.threshold == 0.8
    assert cfg.input.columns.text == "message"


def test_precedence(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("dedup:\n  threshold: 0.7\nclean:\n  max_chars: 500\n")
    cfg = load_config(f, env={"INTENTOPS__DEDUP__THRESHOLD": "0.75"})
    assert cfg.dedup.threshold == 0.75  # env beats file
    assert cfg.clean.max_chars == 500
    cfg = load_config(f, overrides={"dedup.threshold": 0.9}, env={"INTENTOPS__DEDUP__THRESHOLD": "0.75"})
    assert cfg.dedup.threshold == 0.9  # explicit beats env


@pytest.mark.parametrize(
    "overrides",
    [
        {"dedup.threshold": 1.5},
        {"dedup.shingle_k": 12},
        {"clean.min_chars": 0},
        {"dedup.no_such_field": 1},
        {"input.format": "xml"},
        {"input.columns.label": "message"},  # two fields on one column
    ],
)
def test_invalid_config_is_an_error(overrides):
    with pytest.raises(ValidationError):
        load_config(overrides=overrides, env={})


def test_missing_explicit_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "nope.yaml", env={})
