"""Distributed training of the intent classifier (torchrun + DDP, resumable, MLflow-tracked).

``training.train`` is the entry point; ``training.data`` reads and tokenizes the label-QA
curated set, ``training.models`` builds the MiniLM or small classifier, and
``training.checkpoint`` writes the atomic checkpoints a killed run resumes from.
"""
