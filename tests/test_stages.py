"""The stage registry, computed code versions, the import layers and the trigger form."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from core import codeversion, params, stages

PACKAGES = ("core", "textnorm", "pii", "contract", "jobs", "quality", "training", "export", "deploy", "ops",
            "demo")


# --------------------------------------------------------------------------- registry


def test_registry_order_and_upstreams():
    assert stages.NAMES == ("clean", "dedup", "desensitize", "validate", "labelqa", "review", "train",
                            "register", "export", "deploy")
    for i, s in enumerate(stages.STAGES):
        assert set(s.upstream) <= set(stages.NAMES[:i]), s.name
        module, _, fn = s.work.partition(":")
        assert codeversion.module_file(module) is not None, s.work
        assert fn and f"def {fn}(" in codeversion.module_file(module).read_text(), s.work
        if s.check:
            cm, _, cf = s.check.partition(":")
            assert f"def {cf}(" in codeversion.module_file(cm).read_text(), s.check
    assert [s.name for s in stages.STAGES if s.kind == "spark"] == ["clean", "dedup", "desensitize"]
    assert stages.ancestors("train") == ["clean", "dedup", "desensitize", "validate", "labelqa"]


def test_stages_json_cli_starts_neither_spark_nor_torch():
    probe = ("import sys; from ops.cli import main; rc = main(['stages', '--json']); "
             "heavy = [m for m in ('pyspark', 'torch', 'mlflow', 'airflow', 'pandas') if m in sys.modules]; "
             "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY []" in out.stderr
    listed = json.loads(out.stdout)
    assert [s["name"] for s in listed] == list(stages.NAMES)
    for s in listed:
        assert isinstance(s["upstream"], list) and len(s["code_version"]) == 16
        assert s["code_version"] == stages.code_version(s["name"])


# --------------------------------------------------------------------------- code versions


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the project's packages, to edit without touching the checkout."""
    root = tmp_path_factory.mktemp("tree")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _versions(root: Path) -> dict[str, str]:
    return {s.name: codeversion.code_version(s.module, root) for s in stages.STAGES}


def _edited(root: Path, rel: str, extra: bytes) -> dict[str, str]:
    """Stage versions with ``extra`` appended to one file of the copy (then restored)."""
    path = root / rel
    original = path.read_bytes()
    path.write_bytes(original + extra)
    try:
        return _versions(root)
    finally:
        path.write_bytes(original)


def _changed(root: Path, rel: str, extra: bytes = b"\n# edited\n") -> set[str]:
    before = _versions(root)
    after = _edited(root, rel, extra)
    assert _versions(root) == before  # restored
    return {n for n in before if before[n] != after[n]}


def test_the_copy_has_the_checkouts_versions(tree):
    assert _versions(tree) == {s.name: s.code_version() for s in stages.STAGES}


def test_an_indirectly_imported_helper_changes_exactly_the_stages_that_import_it(tree):
    # pii/checksums.py: imported by pii/detector.py, which the desensitize job imports
    # directly and the validation gate through quality/validate_stage.py (two levels down);
    # train records the preprocessing version in the model's contract, and register (the
    # pyfunc) and deploy's servers mask requests with it (contract/preprocess.py).
    assert _changed(tree, "pii/checksums.py") == {"desensitize", "validate", "train", "register", "deploy"}
    # training/models.py: train (through training.train, launched by torchrun), register
    # (the predictor) and export (the ONNX build loads the model class).
    assert _changed(tree, "training/models.py") == {"train", "register", "export"}
    # The text normalization: clean (labels, text), label QA, and training's data reader
    # (so register and export too); dedup has its own Spark version of the key, and the
    # later stages read the label set clean published.
    assert _changed(tree, "textnorm/__init__.py") == {"clean", "labelqa", "review", "train", "register",
                                                      "export", "deploy"}


def test_shipped_data_files_are_part_of_the_version(tree):
    # New detector weights are new masked output, never a cache hit on the old text.
    assert _changed(tree, "pii/data/token_models.json.gz", b"\0") == {"desensitize", "validate", "train",
                                                                     "register", "deploy"}


def test_a_module_no_stage_imports_changes_no_key(tree):
    assert _changed(tree, "ops/report.py") == set()
    assert _changed(tree, "demo/builder.py") == set()


def test_a_new_import_is_followed(tree):
    """Adding an import of a module a stage did not use brings that module into its key."""
    target = tree / "jobs" / "spark" / "dedup.py"
    original = target.read_text()
    before = codeversion.code_files("jobs.spark.dedup", tree)
    assert tree / "quality" / "agreement.py" not in before
    target.write_text(original + "\n\ndef _late():\n    from quality import agreement  # noqa\n")
    try:
        assert tree / "quality" / "agreement.py" in codeversion.code_files("jobs.spark.dedup", tree)
    finally:
        target.write_text(original)


# --------------------------------------------------------------------------- import layers

# What each package may import from the project (besides itself). Stages may use the
# libraries and core; the three stage-to-stage edges are the model code (export builds the
# trained model) and the ONNX builds (deploy serves the export's build; the review push
# pre-labels with the champion's).
LIBRARIES = {"core", "textnorm", "pii", "contract"}
ALLOWED = {
    "core": {"core"},
    "textnorm": {"core"},
    "pii": {"core", "textnorm"},
    "contract": {"core", "textnorm", "pii"},
    "jobs": LIBRARIES,
    "quality": LIBRARIES | {"export"},
    "training": LIBRARIES,
    "export": LIBRARIES | {"training"},
    "deploy": LIBRARIES | {"export"},
    "demo": LIBRARIES,
    "ops": LIBRARIES | {"jobs", "quality", "training", "export", "deploy", "demo"},
}


def _project_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_bytes())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(PACKAGES)


def _dotted_imports(path: Path) -> set[str]:
    """Imported module names in full: ``from core import audit`` gives ``core.audit``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(f"{node.module}.{a.name}" if node.module in PACKAGES else node.module
                         for a in node.names)
    return found


def test_import_layers():
    bad = []
    for pkg, allowed in ALLOWED.items():
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for imported in _project_imports(f) - {pkg} - allowed:
                bad.append(f"{f.relative_to(ROOT)} imports {imported}")
    assert bad == [], "\n".join(bad)


def test_the_layer_table_is_the_documented_one():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for pkg in ALLOWED:
        assert f"`{pkg}/`" in doc, pkg


def test_serving_modules_import_no_pipeline_code():
    """The model server, router and build runtime run in the serving image: no pipeline code
    beyond the build's contract (its preprocessing: the normalization and the PII detector)
    and the audit log and secret files (``core.audit``, ``core.secretfiles``: standard
    library only)."""
    for rel in ("deploy/server.py", "deploy/router.py", "deploy/pool.py", "deploy/cache.py", "deploy/predlog.py",
                "export/runtime.py"):
        assert _project_imports(ROOT / rel) <= {"export", "deploy", "contract", "core"}, rel
        core_modules = {n for n in _dotted_imports(ROOT / rel) if n.split(".")[0] == "core"}
        assert core_modules <= {"core", "core.audit", "core.secretfiles", "core.sysinfo"}, (rel, core_modules)


# --------------------------------------------------------------------------- trigger form


def test_every_exposed_field_is_in_the_form_with_its_type_and_bounds():
    form = params.form()
    assert list(form) == [params.CONFIG_FILE, *params.ALIASES]
    for alias, key in params.ALIASES.items():
        schema = params.field_schema(key)
        entry = form[alias]
        assert entry["default"] is None
        kind = schema.get("type", "string")
        assert entry["type"] == ["null", kind], alias
        for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems"):
            assert entry.get(bound) == schema.get(bound), (alias, bound)
        if "enum" in schema:
            assert entry["enum"] == [None, *schema["enum"]]
        assert key in entry["description"] and len(entry["description"]) > len(key) + 40, alias


@pytest.mark.parametrize("conf, message", [
    ({"epochs": 0}, "training.hparams.epochs"),
    ({"dedup_threshold": 1.5}, "dedup.threshold"),
    ({"pii_mode": "blur"}, "desensitize.mode"),
    ({"canary_steps": [50, 10]}, "deploy.steps"),
    ({"epoch": 2}, "unknown trigger settings ['epoch']"),
])
def test_an_invalid_setting_fails_in_resolve_config(tmp_path, monkeypatch, conf, message):
    from core.runs import SettingsError, resolve_run_config

    monkeypatch.setenv("INTENTOPS__LAKE_ROOT", str(tmp_path / "lake"))
    with pytest.raises(SettingsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        resolve_run_config("r1", conf)
    assert not (tmp_path / "lake").exists()  # nothing saved, nothing ran


def test_the_alert_that_triggered_a_run_is_not_a_setting(tmp_path, monkeypatch):
    from core.runs import load_run_config, resolve_run_config

    monkeypatch.setenv("INTENTOPS__LAKE_ROOT", str(tmp_path / "lake"))
    path, _ = resolve_run_config("r1", {"trigger_alert": {"alertname": "IntentopsChampionTooOld"}, "epochs": 2})
    assert load_run_config(path).training.hparams.epochs == 2


def test_form_values_override_the_config_and_empty_keeps_it(tmp_path, monkeypatch):
    from core.runs import load_run_config, resolve_run_config

    monkeypatch.setenv("INTENTOPS__LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("INTENTOPS__DEDUP__THRESHOLD", "0.85")
    path, note = resolve_run_config("r1", {a: None for a in params.ALIASES} | {
        "epochs": 2, "learning_rate": 1e-3, "min_label_alpha": -1})
    cfg = load_run_config(path)
    assert note is None
    assert cfg.dedup.threshold == 0.85  # empty in the form: the configured value
    assert cfg.training.hparams.epochs == 2 and cfg.training.hparams.lr == 1e-3
    assert cfg.labelqa.min_alpha == -1
    assert cfg.training.hparams.precision == "auto"  # the one set of defaults


def test_a_dataset_config_file_names_everything_after_the_dataset(tmp_path, monkeypatch):
    from core.runs import SettingsError, load_run_config, resolve_run_config

    monkeypatch.setenv("INTENTOPS__LAKE_ROOT", str(tmp_path / "lake"))
    file = tmp_path / "tickets.yaml"
    file.write_text("dataset: tickets\ninput:\n  path: /data/tickets.jsonl\nclean:\n  label_set: infer\n")
    path, _ = resolve_run_config("r1", {"config_file": str(file), "epochs": 2})
    cfg = load_run_config(path)
    assert cfg.dataset == "tickets" and cfg.lake == tmp_path / "lake" / "tickets"
    assert cfg.training.registered_model == "intentops-tickets"
    assert cfg.training.experiment == "intentops-tickets-training"
    assert cfg.tracking.data_quality_experiment == "intentops-tickets-data-quality"
    assert cfg.deploy_dir.parts[-2:] == ("deploy", "tickets")
    assert cfg.clean.label_set == "infer" and cfg.training.hparams.epochs == 2
    assert path.startswith(str(tmp_path / "lake" / "tickets" / "runs"))
    with pytest.raises(SettingsError, match="not a safe name"):
        resolve_run_config("r2", {"dataset": "../etc"})
    with pytest.raises(SettingsError, match="no such file"):
        resolve_run_config("r3", {"config_file": str(tmp_path / "missing.yaml")})
