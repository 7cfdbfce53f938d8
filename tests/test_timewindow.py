"""Training windows ("serve by day, train by night"): the window arithmetic, the train task's
deferral to the window's opening, and the autoscaler holding serving at its minimum."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from core import timewindow
from core.config import load_config
from core.stage import StageDeferred
from deploy.autoscaler import Memory, Signals, decide
from training.task import window_check


def at(h: int, m: int = 0, day: int = 5) -> dt.datetime:
    return dt.datetime(2026, 12, day, h, m, tzinfo=dt.UTC)


def test_window_across_midnight_and_within_a_day() -> None:
    night = "22:00-06:00"
    assert timewindow.inside(night, at(22)) and timewindow.inside(night, at(3))
    assert not timewindow.inside(night, at(6)) and not timewindow.inside(night, at(12))
    assert timewindow.inside("01:00-05:00", at(4, 59)) and not timewindow.inside("01:00-05:00", at(5))
    assert timewindow.inside("", at(12))  # no window: always
    assert timewindow.next_start(night, at(12)) == at(22)
    assert timewindow.next_start(night, at(23)) == at(23)  # inside: now
    assert timewindow.next_start("01:00-05:00", at(7)) == at(1, day=6)  # tomorrow


@pytest.mark.parametrize("bad", ["22-06", "25:00-06:00", "22:00-22:00", "22:00 to 06:00"])
def test_bad_windows_fail_early_in_the_config(bad: str) -> None:
    with pytest.raises(ValidationError, match="time window"):
        load_config(overrides={"training.window": bad})


def test_training_outside_the_window_is_deferred_to_its_opening() -> None:
    window_check("22:00-06:00", at(23))  # inside: goes ahead
    window_check("", at(12))
    with pytest.raises(StageDeferred, match="outside the training window 22:00-06:00") as err:
        window_check("22:00-06:00", at(12))
    assert err.value.until == at(22)


class _Policy:
    min_replicas, max_replicas = 1, 4
    target_outstanding, low_outstanding, max_p99_ms, max_cpu = 16.0, 2.0, 150.0, 0.9
    up_cooldown_seconds, down_cooldown_seconds, down_after_seconds = 10.0, 30.0, 20.0


def test_serving_shrinks_to_its_minimum_inside_the_training_window() -> None:
    hot = Signals(replicas=3, outstanding=120.0, p99_ms=400.0, cpu=0.95)
    want, why = decide(hot, 3, _Policy(), Memory(), now=1000.0, training_window=True)
    assert want == 1 and why.startswith("training window")
    assert decide(hot, 1, _Policy(), Memory(), 1000.0, training_window=True)[0] == 1  # held
    assert decide(hot, 3, _Policy(), Memory(), 1000.0)[0] == 4  # outside: scales up as before
