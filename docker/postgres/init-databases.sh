#!/bin/bash
# Postgres first-start script (mounted into /docker-entrypoint-initdb.d/, which the postgres
# image runs once, when its data volume is empty): one server, one database and one login
# role each for Airflow's metadata and MLflow's tracking/registry store (plus MLflow's
# auth database, owned by the MLflow role). The passwords come
# from the container's environment (docker/.env); a role can reach its own database only.
set -euo pipefail

: "${AIRFLOW_DB_PASSWORD:?AIRFLOW_DB_PASSWORD is not set}"
: "${MLFLOW_DB_PASSWORD:?MLFLOW_DB_PASSWORD is not set}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v airflow_password="$AIRFLOW_DB_PASSWORD" \
    -v mlflow_password="$MLFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
REVOKE ALL ON DATABASE airflow FROM PUBLIC;

CREATE ROLE mlflow LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE mlflow OWNER mlflow;
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;
-- MLflow's basic-auth app: users and permissions (docker/mlflow/basic_auth.ini).
CREATE DATABASE mlflow_auth OWNER mlflow;
REVOKE ALL ON DATABASE mlflow_auth FROM PUBLIC;
SQL
