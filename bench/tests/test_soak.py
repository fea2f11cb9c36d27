"""A soak's verdicts: a process's memory is flat when its last window averages at most 10% over its
first; a process restarted meanwhile is a new life judged on its own; connections may not grow;
a run too short to compare two windows is not a pass."""

from __future__ import annotations

import os

import pytest

from bench.soak import Watch, judge, parse_duration, rss_kb

pytestmark = pytest.mark.bench


def watch_with(memory: dict[str, list[tuple[float, int]]], connections: list[tuple[float, int]]) -> Watch:
    watch = Watch(lambda: [], lambda: None)
    watch.memory, watch.open_connections = memory, connections
    return watch


def test_memory_that_grows_past_a_tenth_in_the_last_window_is_named():
    steady = [(t, 100_000) for t in range(0, 1800, 10)]
    leaking = [(t, 100_000 + 20 * t) for t in range(0, 1800, 10)]
    restarted = [(t, 50_000 + 100 * t) for t in range(1000, 1800, 10)]  # born after the first window
    verdict = judge(watch_with({"agent0 11": steady, "scheduler 12": leaking, "agent1 13": restarted},
                               [(t, 20) for t in range(0, 1800, 10)]), window=600)
    assert verdict["memory_flat"] is False and list(verdict["memory_grown"]) == ["scheduler 12"]
    assert verdict["processes_judged"] == 2 and verdict["connections_flat"] is True


def test_the_harness_is_reported_not_judged_and_its_children_are_not_its_pool():
    verdict = judge(watch_with({"driver 1": [(t, 1000 + t) for t in range(0, 1800, 10)],
                                "payment 2": [(t, 500) for t in range(0, 1800, 10)]}, []), window=600)
    assert verdict["memory_flat"] is True and verdict["processes_judged"] == 1
    assert verdict["harness_growth"] == {"driver 1": pytest.approx(1.0, abs=0.2)}
    watch = Watch(lambda: [("driver", os.getpid())], lambda: None)
    watch.sample()
    assert list(watch.memory) == [f"driver {os.getpid()}"]


def test_connections_that_keep_growing_are_caught():
    verdict = judge(watch_with({"beat 1": [(t, 1000) for t in range(0, 1800, 10)]},
                               [(t, 10 + t // 60) for t in range(0, 1800, 10)]), window=600)
    assert verdict["memory_flat"] is True
    assert (verdict["connections_first_max"], verdict["connections_last_max"], verdict["connections_flat"]) == (
        20, 39, False)


def test_a_run_too_short_for_two_windows_is_no_verdict():
    verdict = judge(watch_with({"driver 1": [(0, 1000), (500, 5000)]}, [(0, 3)]), window=600)
    assert (verdict["memory_flat"], verdict["connections_flat"]) == (None, None)


def test_a_watch_samples_real_processes_and_tolerates_a_database_that_does_not_answer():
    def down() -> int:
        raise ConnectionError("the database is restarting")

    watch = Watch(lambda: [("driver", os.getpid())], down)
    watch.sample()
    assert list(watch.memory) == [f"driver {os.getpid()}"] and watch.open_connections == []
    assert rss_kb(os.getpid()) > 1000


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("90s", 90), ("1h", 3600), ("45", 45)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "0m", "-5s"])
def test_a_bad_duration_is_refused_by_name(text):
    with pytest.raises(ValueError, match=r"duration|more than 0"):
        parse_duration(text)
