"""Operations on top of the pipeline: the CLI, local services, the run report, the Airflow client, the leak scanner."""
