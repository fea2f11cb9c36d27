"""A chaos run's or soak's orders in bursts (``--bursts S``): each minute, the orders due in its first
S seconds are submitted at once — the same orders in the same time, so that a soak has backlogs
to judge the at-risk alerts' recall on."""

from __future__ import annotations

import pytest

from bench.chaos import BURST_PERIOD_S, arrival, parse

pytestmark = pytest.mark.bench


def test_without_bursts_orders_come_evenly_at_the_rate():
    assert [arrival(i, 5.0) for i in (0, 1, 50, 299)] == pytest.approx([0.0, 0.2, 10.0, 59.8])


def test_a_burst_brings_the_first_seconds_orders_of_each_minute_at_its_start_and_no_others():
    times = [arrival(i, 5.0, bursts=10.0) for i in range(3 * 300)]
    assert times[:50] == [0.0] * 50 and times[50] == pytest.approx(10.0)          # 50 orders at once, then evenly
    assert times[300:350] == [pytest.approx(BURST_PERIOD_S)] * 50 and times[350] == pytest.approx(70.0)
    assert times == sorted(times) and max(times) == pytest.approx(899 / 5.0)      # in order, done as soon


@pytest.mark.parametrize("bursts", ["-1", "60", "90"])
def test_a_burst_longer_than_its_minute_or_negative_is_refused_naming_the_option(bursts, capsys):
    with pytest.raises(SystemExit):
        parse(["--soak", "10m", "--bursts", bursts])
    assert "--bursts must be from 0 to under 60 seconds" in capsys.readouterr().err
