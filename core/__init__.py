"""intentops: an Airflow-orchestrated MLOps pipeline for text classification."""

__version__ = "0.1.0"
