# intentops: the two commands a new user runs are `make demo` and `make test`.
# Both create the virtual environment first (pip, pinned by constraints.txt).

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
ROWS   ?= 20000
SEED   ?= 7

# Everything Airflow and Spark need, project-local: no state outside this folder.
export PATH := $(BIN):$(PATH)
export AIRFLOW_HOME := $(CURDIR)/var/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__UNIT_TEST_MODE := False
export AIRFLOW_CONN_SPARK_DEFAULT ?= {"conn_type": "spark", "host": "local[*]"}
export PYSPARK_PYTHON := $(BIN)/python
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: demo test venv lint spark-archive bench mlflow clean-var up down browser test-deps monitoring-deps label-studio pii-corpus pii-tables pii-models cluster-deps cluster-up cluster-down test-cluster

# Run the whole pipeline on the bundled demo data, through Airflow.
demo: $(VENV)/.installed
	$(BIN)/intentops build-raw --out var/demo/raw --rows $(ROWS) --seed $(SEED) --format csv --daily --source train
	$(BIN)/airflow db migrate > var/airflow-db.log 2>&1 || (cat var/airflow-db.log; exit 1)
	$(BIN)/airflow pools set intentops_registry 1 "model registry writes, one at a time" > /dev/null
	$(BIN)/airflow pools set intentops_spark 1 "Spark jobs (spark-submit slots)" > /dev/null
	$(BIN)/airflow pools set intentops_training 1 "training process groups (torchrun); preemptible by priority" > /dev/null
	$(BIN)/airflow dags test intentops_pipeline \
	  --conf '{"input_path": "var/demo/raw/raw.csv"}' > var/demo/dags-test.log 2>&1 \
	  || (tail -n 80 var/demo/dags-test.log; exit 1)
	@echo "Airflow log: var/demo/dags-test.log"
	@$(BIN)/intentops summary

# What the tests need from Debian's packages, installed only when missing (apt-get needs
# root): Chromium and its driver for the run report's browser test, the Postgres server for
# the check of docker/'s database init script, Prometheus, Alertmanager and the Pushgateway
# (the monitoring stack of `make up` and its tests).
browser: test-deps
test-deps: monitoring-deps label-studio
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || ( apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver )
	@ls /usr/lib/postgresql/*/bin/initdb > /dev/null 2>&1 || command -v initdb > /dev/null || ( \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql )

# Label Studio in a virtual environment of its own (its pyarrow and pytz pins clash with
# the pipeline's): make up's review service and the review-loop tests' server.
LABEL_STUDIO := .venv-label-studio
label-studio: $(LABEL_STUDIO)/.installed
$(LABEL_STUDIO)/.installed: constraints-label-studio.txt
	test -x $(LABEL_STUDIO)/bin/python || $(PYTHON) -m venv $(LABEL_STUDIO)
	$(LABEL_STUDIO)/bin/pip install -q -c constraints-label-studio.txt label-studio
	touch $@

# The scaled-out shape as local processes (ops/cluster.py, configured from
# docker/compose.yaml): Debian's Postgres and Redis servers, the `cluster` extra (the
# CeleryExecutor, the Postgres drivers).
cluster-deps: $(VENV)/.cluster-installed
	@command -v redis-server > /dev/null || ( apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server )
	@ls /usr/lib/postgresql/*/bin/initdb > /dev/null 2>&1 || ( apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql )
$(VENV)/.cluster-installed: $(VENV)/.installed pyproject.toml constraints.txt
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,cluster]'
	touch $@

cluster-up: cluster-deps
	$(BIN)/intentops cluster-up
cluster-down: $(VENV)/.installed
	$(BIN)/intentops cluster-down

# The cluster shape's end-to-end and fault tests (tests/test_cluster.py; `make test`
# leaves them out, and so does .ci/run: see the README).
test-cluster: cluster-deps
	$(BIN)/python -m pytest -q -m cluster tests/test_cluster.py

# Prometheus, Alertmanager and the Pushgateway from Debian (make up's monitoring stack).
monitoring-deps:
	@command -v promtool > /dev/null && command -v prometheus-alertmanager > /dev/null \
	  && command -v prometheus-pushgateway > /dev/null || ( apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
	  prometheus-alertmanager prometheus-pushgateway )

# The test suite: unit, Spark, DAG integrity and end-to-end through `airflow dags test`.
# On a fresh clone the two virtual environments (the project's, Label Studio's) are built
# side by side first: 3.3 min instead of 4.7 one after the other (2 cores, pip's cache warm).
# Two workers, a whole module each at a time (its module fixtures: one Airflow home, one
# services stack); the longest modules first, so they run side by side, not one after the
# other at the end. About half the suite's time is spent waiting on Airflow, servers and
# canary bakes, which is what the second worker uses.
SLOWEST_MODULES = tests/test_services.py tests/test_e2e_airflow.py tests/test_training.py tests/test_canary.py
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(VENV)/.installed test-deps
	@$(MAKE) --no-print-directory spark-archive
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder \
	  $(SLOWEST_MODULES) $(filter-out $(SLOWEST_MODULES),$(sort $(wildcard tests/test_*.py)))

# The Spark JVM's class-data-sharing archive (spark.class_archive names it): each
# spark-submit maps Spark's classes instead of loading them (about a third of an empty
# job's CPU here). Built once per machine, in about a minute; again when Spark changes.
spark-archive: $(VENV)/spark-classes.jsa
$(VENV)/spark-classes.jsa: $(VENV)/.installed jobs/spark/class_archive.py
	$(BIN)/intentops spark-archive --out $@ --set spark.java_options=-XX:TieredStopAtLevel=1

lint: $(VENV)/.installed
	$(BIN)/ruff check .

# The local services: MLflow (UI + registry), airflow standalone (UI + REST API), the
# router and the champion's model server, Label Studio (127.0.0.1:8300, the review loop);
# URLs and the credentials file are printed.
# Logs in var/services/logs/. A second `up` is harmless; `down` stops only what `up`
# (and the pipeline's deploy task) started.
up: $(VENV)/.installed monitoring-deps label-studio spark-archive
	@test -d var/demo/raw/daily || $(BIN)/intentops build-raw --out var/demo/raw --rows $(ROWS) \
	  --seed $(SEED) --format csv --daily --source train > /dev/null
	$(BIN)/intentops up

down: $(VENV)/.installed
	$(BIN)/intentops down

# Benchmarks (not part of the tests): results in benchmarks/results/, quoted in docs/BENCHMARKS.md.
bench: $(VENV)/.installed label-studio
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,bench]'
	$(BIN)/python benchmarks/data_stages.py --stages clean dedup desensitize
	$(BIN)/python benchmarks/pii_presidio.py --raw var/bench/raw-1000000 --sample 4000
	$(BIN)/python benchmarks/pii_eval.py
	$(BIN)/python benchmarks/labelqa.py
	$(BIN)/python benchmarks/labeling.py
	$(BIN)/python benchmarks/training.py --epochs 5
	$(BIN)/python benchmarks/export.py --repeats 3

# The PII detector's build tools (tools/). Not needed to run or test the pipeline: their
# outputs are committed (pii/data/, data/pii_eval/). presidio-evaluator needs
# pandas 3 and names-dataset holds 3 GB in memory, so the first two run in a venv of their
# own; the token models train in the project's venv (scikit-learn).
PII_TOOLS := .venv-pii-tools
$(PII_TOOLS)/.installed: tools/requirements-pii.txt
	test -x $(PII_TOOLS)/bin/python || $(PYTHON) -m venv $(PII_TOOLS)
	$(PII_TOOLS)/bin/pip install -q -r tools/requirements-pii.txt
	touch $@

# presidio-evaluator's sentences, split by template (data/pii_eval/presidio_*.jsonl)
pii-corpus: $(PII_TOOLS)/.installed
	$(PII_TOOLS)/bin/python tools/pii_corpus.py --out data/pii_eval

# the English lexicon of word forms and their grammar (pii/data/lexicon.tsv.gz), then the
# trimmed name / English-word table (pii/data/names.tsv.gz) and the rare names
# (pii/data/rare_names.npz), which leave the lexicon's words out
pii-tables: $(PII_TOOLS)/.installed
	$(PII_TOOLS)/bin/python tools/pii_lexicon.py
	$(PII_TOOLS)/bin/python tools/pii_tables.py

# the PERSON and ADDRESS token models (pii/data/token_models.json.gz)
pii-models: $(VENV)/.installed
	$(BIN)/python tools/pii_token_models.py

# The MLflow UI over the local store the stages log to (when MLFLOW_TRACKING_URI is unset).
mlflow: $(VENV)/.installed
	mkdir -p var/mlflow/artifacts
	$(BIN)/mlflow server --host 127.0.0.1 --port 5000 \
	  --backend-store-uri sqlite:///$(CURDIR)/var/mlflow/mlflow.db \
	  --artifacts-destination $(CURDIR)/var/mlflow/artifacts

venv: $(VENV)/.installed

# pyspark-client (required by the Spark provider) ships a copy of the pyspark Python
# package that overwrites pyspark's own; reinstalling pyspark last restores the files that
# match its JVM jars.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/pip install -q --force-reinstall --no-deps -c constraints.txt pyspark
	mkdir -p var
	touch $@

clean-var:
	rm -rf var
