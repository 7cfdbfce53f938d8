"""The registry asks who you are: the session's MLflow server runs MLflow's basic-auth app
(as ``make up`` runs it, ``core/registry_auth.py``); the rest of the suite, the pipeline
end to end included, talks to it as the pipeline user."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import httpx
import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from core import registry_auth
from core.registry_auth import ADMIN_USER, FOLLOWER_USER, PIPELINE_USER, RegistryCredentials
from core.secretfiles import create_private, write_private


def _version(client: MlflowClient, name: str, tmp_path) -> str:
    exp = client.create_experiment(f"auth-{uuid.uuid4().hex[:8]}")
    run = client.create_run(exp)
    f = tmp_path / "model.txt"
    f.write_text("a model")
    client.log_artifact(run.info.run_id, str(f))
    client.set_terminated(run.info.run_id)
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    return client.create_model_version(name, f"runs:/{run.info.run_id}/model.txt", run.info.run_id).version


def _as(user: str, creds: RegistryCredentials, monkeypatch, uri: str) -> MlflowClient:
    for k, v in registry_auth.client_env(creds, user).items():
        monkeypatch.setenv(k, v)
    return MlflowClient(uri)


@pytest.fixture
def champion(mlflow_server, tmp_path):
    """A registered model with two versions, ``champion`` on version 1, made by the
    pipeline user (the suite's default identity)."""
    client = MlflowClient(mlflow_server)
    name = f"auth-model-{uuid.uuid4().hex[:8]}"
    v1 = _version(client, name, tmp_path)
    v2 = _version(client, name, tmp_path)
    client.set_registered_model_alias(name, "champion", v1)
    return {"name": name, "v1": v1, "v2": v2}


def test_an_unauthenticated_alias_move_is_refused(mlflow_server, champion):
    body = {"name": champion["name"], "alias": "champion", "version": champion["v2"]}
    r = httpx.post(f"{mlflow_server}/api/2.0/mlflow/registered-models/alias", json=body)
    assert r.status_code == 401
    # Wrong password: refused the same way.
    r = httpx.post(f"{mlflow_server}/api/2.0/mlflow/registered-models/alias", json=body,
                   auth=(PIPELINE_USER, "not-the-password"))
    assert r.status_code == 401
    # Reading without credentials is refused too.
    assert httpx.get(f"{mlflow_server}/api/2.0/mlflow/registered-models/get",
                     params={"name": champion["name"]}).status_code == 401
    assert MlflowClient(mlflow_server).get_model_version_by_alias(champion["name"], "champion").version \
        == champion["v1"]


def test_the_follower_reads_the_champion_but_cannot_move_it(mlflow_server, champion, registry_credentials,
                                                            monkeypatch, tmp_path):
    follower = _as(FOLLOWER_USER, registry_credentials, monkeypatch, mlflow_server)
    mv = follower.get_model_version_by_alias(champion["name"], "champion")
    assert mv.version == champion["v1"]
    # ... downloads the build the alias points at ...
    got = mlflow.artifacts.download_artifacts(mv.source, dst_path=str(tmp_path / "dl"),
                                              tracking_uri=mlflow_server)
    assert Path(got).read_text() == "a model"
    # ... and may not move it.
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED|Permission denied"):
        follower.set_registered_model_alias(champion["name"], "champion", champion["v2"])
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED|Permission denied"):
        follower.create_model_version(champion["name"], mv.source, mv.run_id)  # nor register into it
    monkeypatch.undo()
    pipeline = MlflowClient(mlflow_server)
    assert pipeline.get_model_version_by_alias(champion["name"], "champion").version == champion["v1"]
    pipeline.set_registered_model_alias(champion["name"], "champion", champion["v2"])  # the pipeline may
    assert pipeline.get_model_version_by_alias(champion["name"], "champion").version == champion["v2"]


def test_provisioning_is_idempotent_and_hands_existing_models_to_the_pipeline(
        mlflow_server, registry_credentials, monkeypatch, tmp_path):
    # A model made before the registry had the pipeline user (here: by the admin) is not the
    # pipeline's to move until provisioning grants it.
    admin = _as(ADMIN_USER, registry_credentials, monkeypatch, mlflow_server)
    name = f"pre-auth-{uuid.uuid4().hex[:8]}"
    v1 = _version(admin, name, tmp_path)
    monkeypatch.undo()
    pipeline = MlflowClient(mlflow_server)
    with pytest.raises(MlflowException, match="403|PERMISSION_DENIED|Permission denied"):
        pipeline.set_registered_model_alias(name, "champion", v1)
    registry_auth.provision(mlflow_server, registry_credentials)
    registry_auth.provision(mlflow_server, registry_credentials)  # a second `make up`
    pipeline.set_registered_model_alias(name, "champion", v1)
    assert pipeline.get_model_version_by_alias(name, "champion").version == v1


def test_the_provision_command_reads_its_passwords_from_the_environment(mlflow_server, registry_credentials,
                                                                        project_env):
    import subprocess
    import sys

    env = {k: v for k, v in project_env.items()
           if k not in ("MLFLOW_AUTH_ADMIN_PASSWORD", "INTENTOPS_MLFLOW_PIPELINE_PASSWORD")}
    out = subprocess.run([sys.executable, "-m", "core.registry_auth", "provision", mlflow_server],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" in out.stderr and "INTENTOPS_MLFLOW_PIPELINE_PASSWORD" in out.stderr
    env.update(MLFLOW_AUTH_ADMIN_PASSWORD=registry_credentials.admin_password,
               INTENTOPS_MLFLOW_PIPELINE_PASSWORD=registry_credentials.pipeline_password,
               INTENTOPS_MLFLOW_FOLLOWER_PASSWORD=registry_credentials.follower_password,
               MLFLOW_FLASK_SERVER_SECRET_KEY=registry_credentials.flask_secret_key)
    out = subprocess.run([sys.executable, "-m", "core.registry_auth", "provision", mlflow_server],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # A wrong admin password is a clear error, not a traceback.
    env["MLFLOW_AUTH_ADMIN_PASSWORD"] = "wrong-admin-password"
    out = subprocess.run([sys.executable, "-m", "core.registry_auth", "provision", mlflow_server],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "401" in out.stderr and "Traceback" not in out.stderr


def test_credentials_are_generated_once_in_a_private_file(tmp_path):
    path = tmp_path / "services" / "credentials.json"
    first = RegistryCredentials.load_or_create(path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert RegistryCredentials.load_or_create(path) == first
    values = [first.admin_password, first.pipeline_password, first.follower_password, first.flask_secret_key]
    assert len(set(values)) == 4 and all(len(v) >= 24 and "change" not in v for v in values)
    assert RegistryCredentials.load_or_create(tmp_path / "other.json") != first
    ini = registry_auth.write_server_config(tmp_path / "auth", "sqlite:///x.db").read_text()
    assert first.admin_password not in ini and "admin_password" not in ini


def test_secret_files_are_private_from_the_first_byte_and_created_once(tmp_path):
    f = tmp_path / "keys"
    write_private(f, "one\n")
    assert oct(f.stat().st_mode & 0o777) == "0o600" and f.read_text() == "one\n"
    write_private(f, "two\n")  # replaced whole
    assert f.read_text() == "two\n" and oct(f.stat().st_mode & 0o777) == "0o600"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    g = tmp_path / "once"
    results: list[bool] = []
    threads = [threading.Thread(target=lambda i=i: results.append(create_private(g, f"value-{i}\n")))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert g.read_text().startswith("value-") and oct(g.stat().st_mode & 0o777) == "0o600"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_commands_run_by_hand_reach_the_services_registry_as_the_pipeline(tmp_path, monkeypatch):
    from ops.services import Services, apply_client_credentials

    monkeypatch.setenv("INTENTOPS_SERVICES_ROOT", str(tmp_path / "services"))
    svc = Services()
    creds = svc.registry_credentials()
    env = {"MLFLOW_TRACKING_URI": svc.mlflow_url + "/"}
    assert apply_client_credentials(env)
    assert env["MLFLOW_TRACKING_USERNAME"] == PIPELINE_USER
    assert env["MLFLOW_TRACKING_PASSWORD"] == creds.pipeline_password
    other = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:1"}
    assert not apply_client_credentials(other) and "MLFLOW_TRACKING_USERNAME" not in other
    mine = {"MLFLOW_TRACKING_URI": svc.mlflow_url, "MLFLOW_TRACKING_USERNAME": "someone"}
    assert not apply_client_credentials(mine) and mine["MLFLOW_TRACKING_USERNAME"] == "someone"
    described = svc.describe({})["mlflow"]
    assert described["auth"] == "basic" and described["credentials_file"].endswith("credentials.json")
    assert creds.pipeline_password not in json.dumps(svc.describe({}))
    assert svc.env()["MLFLOW_TRACKING_USERNAME"] == PIPELINE_USER


def test_the_server_starts_without_mlflow_job_execution_unless_asked(tmp_path, monkeypatch):
    """MLflow 3's job execution (seven Huey consumers per server, for GenAI jobs nothing
    here runs) is off in the servers the project starts; the environment can turn it on."""
    creds = registry_auth.RegistryCredentials.load_or_create(tmp_path / "credentials.json")
    monkeypatch.delenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", raising=False)
    assert registry_auth.server_env(creds, tmp_path / "auth")["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "true")
    assert registry_auth.server_env(creds, tmp_path / "auth")["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "true"
