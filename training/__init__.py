"""Distributed training of the intent classifier (torchrun + DDP, resumable, MLflow-tracked).

``training.train`` is the torchrun entry point and the loop, readable in one sitting; beside
it ``distributed`` (process group and collectives), ``optim`` (schedule, parameter groups,
autocast), ``state`` (run state, checkpoint and resume), ``metrics`` (evaluation, report,
confusion matrix), ``outputs`` (the files a run writes), ``mlflow_log`` (worker-side MLflow
logging) and ``config`` (the hyper-parameters, defined once in ``core.config``).
``training.data`` reads and tokenizes the label-QA curated set, ``training.models`` builds
the MiniLM or small classifier, ``training.checkpoint`` writes the atomic checkpoints a
killed run resumes from. The stage wrappers: ``task`` (train), ``register_stage`` (the
behavioural checks and the registry gate in ``registry`` and ``behaviour``).
"""
