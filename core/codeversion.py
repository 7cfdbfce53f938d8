"""A stage's code version, computed from what its entry point imports.

The version is a hash over every project module in the entry module's import closure
(imports at the top of a file and inside functions, followed through packages, two or
ten levels down alike; a string literal that names a project module, such as the
``"training.train"`` a stage launches with ``python -m``, counts as an import too) and the data files those packages ship (``pii/data/``: name
tables, model weights). Nothing is listed by hand, so a fix to a helper the stage
imports is always a cache miss, and an edit to a module it never imports is not.

The closure is read with :mod:`ast`, not by importing: it costs no Spark or torch start
and works for ``jobs/spark/*.py`` run as scripts by spark-submit. Over-approximation is
the safe side: an import under ``if TYPE_CHECKING:`` counts too (a needless cache miss
at worst, never a stale hit).
"""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

from core import __version__

PROJECT_ROOT = Path(__file__).resolve().parent.parent
_DOTTED = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+")


def module_file(name: str, root: Path = PROJECT_ROOT) -> Path | None:
    """The project file of a dotted module name, or None for a module not in the project."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imported_names(path: Path, root: Path) -> set[str]:
    """Dotted names a file imports, each with its parent packages (importing ``a.b.c``
    runs ``a/__init__.py`` and ``a/b/__init__.py`` too)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    this = _module_name(path, root)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x, from ..a import b
                base_parts = package.split(".") if package else []
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            # ``from a import b``: b may be a module of package a, or a name in it.
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _DOTTED.fullmatch(node.value) and module_file(node.value, root) is not None):
            # "training.train" in ``[python, "-m", "training.train"]``: a module the stage
            # runs as a process. Only a string that names a project module exactly counts
            # (not "training.hparams.lr", a config key).
            names.add(node.value)
    expanded: set[str] = set()
    for name in filter(None, names):
        parts = name.split(".")
        expanded.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return expanded


def import_closure(entry: str, root: Path = PROJECT_ROOT) -> tuple[Path, ...]:
    """Every project file ``entry`` (a dotted module name) imports, directly or not,
    itself included, sorted."""
    start = module_file(entry, root)
    if start is None:
        raise ValueError(f"{entry}: not a module of the project under {root}")
    seen: set[Path] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imported_names(path, root):
            found = module_file(name, root)
            if found is not None and found not in seen:
                todo.append(found)
    return tuple(sorted(seen))


def package_data(files: tuple[Path, ...], root: Path = PROJECT_ROOT) -> tuple[Path, ...]:
    """Non-Python files shipped inside the packages of ``files`` (weights, lexicons)."""
    out: set[Path] = set()
    for pkg_dir in {f.parent for f in files if f.name == "__init__.py"}:
        for p in pkg_dir.rglob("*"):
            if (p.is_file() and p.suffix not in (".py", ".pyc")
                    and "__pycache__" not in p.parts and not p.name.startswith(".")):
                # only the package's own files, not a nested package's (it has its own entry)
                owner = next(d for d in p.parents if (d / "__init__.py").is_file() or d == root)
                if owner == pkg_dir:
                    out.add(p)
    return tuple(sorted(out))


def code_files(entry: str, root: Path = PROJECT_ROOT) -> tuple[Path, ...]:
    modules = import_closure(entry, root)
    return modules + package_data(modules, root)


def code_version(entry: str, root: Path = PROJECT_ROOT) -> str:
    """16 hex digits over the package version and every file of ``code_files(entry)``,
    each keyed by its path relative to the project (a module run as ``__main__`` by
    spark-submit and the same module imported by a test get the same version)."""
    digest = hashlib.sha256(__version__.encode())
    for f in code_files(entry, root):
        digest.update(str(f.relative_to(root)).encode())
        digest.update(b"\0")
        digest.update(f.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
