"""An agent's circuit breaker kept in the state store (the broker is not Redis): what one worker
process's failures open, another sees open; one probe at a time; a good probe closes it for all."""

from __future__ import annotations

import pytest

from sas_app.agents.breaker import Breaker, BreakerOpen
from tests.support import wait_for

pytestmark = pytest.mark.both_stores


class Down(Exception):
    pass


def fail() -> None:
    raise Down("the service is down")


def breaker(sas, fresh=0.0):
    """A breaker as a worker process would hold it, over the store's table."""
    return Breaker("pay", fail_max=3, reset_timeout=0.5, shared=sas.store.breaker_state,
                   counts=lambda exc: isinstance(exc, Down), fresh=fresh)


def test_failures_in_one_process_open_the_breaker_for_every_other(sas):
    one, other = breaker(sas), breaker(sas)
    for _ in range(2):
        with pytest.raises(Down):
            one.call(fail)
    assert other.call(lambda: "ok") == "ok"  # not yet: and a success resets the count for everyone
    for _ in range(2):
        with pytest.raises(Down):
            other.call(fail)
    with pytest.raises(BreakerOpen):  # the third failure in a row, in the other process, opens it
        one.call(fail)
    with pytest.raises(BreakerOpen) as deferred:
        other.call(lambda: "never called")
    assert 0 < deferred.value.delay <= 0.5 and other.state == "open"


def test_after_the_reset_one_probe_at_a_time_and_a_good_one_closes_it_for_all(sas):
    one, other, third = breaker(sas), breaker(sas), breaker(sas, fresh=0.2)
    for _ in range(3):
        with pytest.raises((Down, BreakerOpen)):
            one.call(fail)
    assert third.state == "open"
    wait_for(lambda: other.open_for() == 0, 2, "the reset timeout")
    probing = []

    def probe() -> str:
        with pytest.raises(BreakerOpen):  # while one probes, the others defer
            one.call(lambda: "a second probe")
        probing.append(True)
        return "fine"

    assert other.call(probe) == "fine" and probing
    assert one.call(lambda: "ok") == "ok" and one.state == "closed"
    wait_for(lambda: third.state == "closed", 1, "a process trusting its last read to read again")
    assert sas.store.breaker_state().get("sas:breaker:pay:fail_counter") == "0"


def test_failures_count_in_a_row_across_processes_however_fresh_their_reads(sas):
    """Each process trusts its reads for half a second; a success still zeroes the shared count."""
    one, other = breaker(sas, fresh=0.5), breaker(sas, fresh=0.5)
    assert other.call(lambda: "ok") == "ok"  # it has read the count: 0
    for _ in range(2):
        with pytest.raises(Down):
            one.call(fail)
    assert other.call(lambda: "ok") == "ok"  # its cached 0 is stale: the success zeroes the count anyway
    with pytest.raises(Down):  # one failure after a success: not a third in a row
        one.call(fail)
    assert one.state == "closed" and sas.store.breaker_state().get("sas:breaker:pay:fail_counter") == "1"


def test_a_probe_holds_its_lock_as_long_as_the_call_may_last_then_lets_it_go(sas):
    one = breaker(sas)
    for _ in range(3):
        with pytest.raises((Down, BreakerOpen)):
            one.call(fail)
    wait_for(lambda: one.open_for() == 0, 2, "the reset timeout")
    lock = "sas:breaker:pay:probe"

    def slow_probe() -> str:
        assert sas.store.breaker_state().claim(lock, "someone else", 1.0) is False  # held past the 0.5 s reset
        return "fine"

    assert one.call(slow_probe, lasts=30.0) == "fine"
    assert sas.store.breaker_state().claim(lock, "next", 1.0), "released once the probe ended"
