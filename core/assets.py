"""The Airflow Assets that close the loop: the monitoring DAG emits them, the pipeline DAG
is scheduled on them (or its daily time). Names only, no Airflow import: the DAG files
build the ``Asset`` objects from these, so both sides name the same asset.

* ``DRIFT``: a monitoring check found drift; the event's extra holds the figures, the
  reasons, the window and the path of the sample (prediction ids) behind the verdict.
* ``NEW_LABELS``: enough feedback labels arrived since the last such event.
* ``REVIEW``: enough unlabeled out-of-scope or abstained traffic to send for review; not a
  retraining trigger (people review it first).
"""

from __future__ import annotations

DRIFT = ("intentops_drift_detected", "intentops://monitoring/drift")
NEW_LABELS = ("intentops_new_labels", "intentops://monitoring/new-labels")
REVIEW = ("intentops_review_traffic", "intentops://monitoring/review-traffic")

# What starts a retraining run: drift or new labels (``|`` in the DAG's asset expression).
RETRAIN_TRIGGERS = (DRIFT, NEW_LABELS)
