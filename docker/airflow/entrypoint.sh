#!/bin/sh
# Entrypoint of the Airflow image (also the Spark master's and workers'): sets what can only
# be known inside the running container, then runs the command.
set -eu

# Spark runs in client mode: the driver lives in the Celery worker that runs spark-submit, and
# the executors in the spark-worker containers connect back to it. Advertise this container's
# address: a service name is shared by every replica of a service, and a container's own host
# name is not resolvable from the other containers.
if [ -z "${SPARK_LOCAL_HOSTNAME:-}" ]; then
    SPARK_LOCAL_HOSTNAME="$(hostname -i | awk '{print $1}')"
    export SPARK_LOCAL_HOSTNAME
fi

# Airflow's simple auth manager reads user passwords from a JSON file. Where the compose file
# hands the api-server an admin password, write that file (mode 0600) so the password is the
# operator's and not a generated one printed into the log.
if [ -n "${AIRFLOW_ADMIN_PASSWORD:-}" ] && [ -n "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-}" ]; then
    python - <<'PY'
import json
import os

path = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
users = os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin")
user = users.split(",")[0].split(":")[0].strip()
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as fh:
    json.dump({user: os.environ["AIRFLOW_ADMIN_PASSWORD"]}, fh)
PY
    unset AIRFLOW_ADMIN_PASSWORD
fi

exec "$@"
