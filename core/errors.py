"""The errors a stage raises for a reason the user can act on.

Apart from ``core/stage.py`` so that the libraries the served builds carry (``textnorm``,
through ``contract.preprocess``) import only this: a build's preprocessing version is the
code version of that import closure, and it must change when the text preparation changes,
not when the stage machinery does.
"""

from __future__ import annotations

from typing import Any


class StageError(RuntimeError):
    """A stage failed for a reason the user can act on (bad input, bad config)."""


class StageVerdict(StageError):
    """The stage ran and its verdict stops the run: a gate failed on the data, a model
    failed its parity check, a rollout was rolled back. A property of the data or the model,
    not a transient error: the DAG fails the task at once instead of retrying it, and the
    CLI exits with status 3."""


class StageSkipped(StageError):
    """The stage has nothing to do in this run and says why (an optional service that is
    not configured, an upstream that published nothing): the DAG marks the task skipped
    with the reason, the CLI prints it; neither is a silent success."""


class StageDeferred(StageError):
    """Not now: run the stage again at ``until`` (None: after the configured delay), without
    counting it as a failure (the DAG reschedules the task)."""

    def __init__(self, message: str, until: Any = None) -> None:
        super().__init__(message)
        self.until = until


class StagePreempted(StageDeferred):
    """The stage's work was preempted (a higher-priority job needed its resources) after
    saving its progress: run it again later to resume, without counting it as a failure."""
