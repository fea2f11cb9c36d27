"""An agent's rate limit holds across every worker process: each call reserves a slot in one shared
schedule (Redis, or the state store), slots one interval apart; a call whose slot is too far off
is not made, and its step is deferred without a failure counted."""

from __future__ import annotations

import os
import threading
import time
import uuid
from functools import partial
from itertools import pairwise

import pytest

from sas_app import AgentCall, SasApp, Settings, Step, Workflow
from sas_app.agents.rate_limit import LocalSlots, RedisSlots, per_second
from sas_app.errors import WorkflowDefinitionError
from sas_app.states import EventKind

REDIS = os.environ.get("SAS_TEST_REDIS", "redis://127.0.0.1:6379")


def test_a_rate_limit_is_written_as_celery_writes_them():
    assert [per_second(text) for text in ("20/s", "120/m", "36/h", "4")] == [20.0, 2.0, 0.01, 4.0]
    for bad in ("fast", "10/x", "0/s", "-1/s", ""):
        with pytest.raises(WorkflowDefinitionError, match="is not a positive rate"):
            per_second(bad)


def test_a_bad_rate_limit_is_refused_where_it_is_written(tmp_path):
    sas = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 's.db'}", broker_url="memory://localhost/",
                          home=tmp_path / "home"))
    with pytest.raises(WorkflowDefinitionError, match="'twenty' is not a positive rate"):
        sas.agent("payment", rate_limit="twenty")
    with pytest.raises(WorkflowDefinitionError, match="rate_limit_key needs a rate_limit"):
        sas.agent("payment", rate_limit_key=lambda call: call.payload["tenant"])
    assert "payment" not in sas.agents  # nothing half-declared
    with pytest.raises(ValueError, match="SAS_AGENT_RATE_LIMITS: 'payment=fast' is not agent=limit"):
        Settings.from_env({"SAS_AGENT_RATE_LIMITS": "warehouse=5/s,payment=fast"})


# -- the shared schedule, on each place it is kept --------------------------------------------------


def spaced_by_the_interval(open_slots, clock=time.time) -> None:
    """Eight processes (threads, each with its own connection) reserve at once: every slot is its
    own, one interval after another, on one clock — the schedule's own (``clock``: the virtual one
    the embedded store reads in the test kit, which stands still however long a thread waits)."""
    key, interval = f"sas:rate:test-{uuid.uuid4().hex[:8]}", 0.1
    starts: list[tuple[float, float]] = []  # each slot's start as seen here: no earlier, no later
    lock = threading.Lock()

    def reserve() -> None:
        slots = open_slots()
        before = clock()
        reserved, wait = slots.reserve(key, interval, 10.0)
        after = clock()
        assert reserved
        with lock:  # the wait counts from the schedule's clock, read between before and after
            starts.append((before + wait, after + wait))

    threads = [threading.Thread(target=reserve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    starts.sort()
    # one interval between each slot and the next, within what a busy machine's reading can say
    gaps = [(b_first - a_last, b_last - a_first) for (a_first, a_last), (b_first, b_last) in pairwise(starts)]
    assert len(starts) == 8 and all(least - 0.03 < interval < most + 0.03 for least, most in gaps), gaps

    slots = open_slots()
    reserved, wait = slots.reserve(key, interval, 0.05)  # the next free slot is ~0.8 s off
    assert not reserved and 0.6 < wait < 0.85
    reserved, turn = slots.reserve(key, interval, 0.05)
    assert not reserved and abs(turn - (wait + interval)) < 0.05, "refused calls take turns one interval apart"
    reserved, again = slots.reserve(key, interval, 10.0)
    assert reserved and abs(again - wait) < 0.05, "a refused reservation takes no slot"
    assert slots.reserve(f"{key}:other", interval, 0.0) == (True, 0.0), "each key its own schedule"


def a_stale_line_is_forgotten_once_the_schedule_is_idle(slots, wait=time.sleep) -> None:
    """Twenty calls turned away whose steps never come back (their runs cancelled) leave the line
    four seconds ahead; once the schedule has been idle, a call turned away waits for the slots'
    own schedule, not behind those twenty turns."""
    key, interval = f"sas:rate:test-{uuid.uuid4().hex[:8]}", 0.2
    assert slots.reserve(key, interval, 10.0) == (True, 0.0)
    turns = [slots.reserve(key, interval, 0.0) for _ in range(20)]
    assert all(not reserved for reserved, _ in turns) and turns[-1][1] > 3.5
    wait(0.3)  # past the one reserved slot: the schedule is idle
    assert slots.reserve(key, interval, 10.0) == (True, 0.0)
    reserved, turn = slots.reserve(key, interval, 0.0)
    assert not reserved and turn < 0.3, turn
    # a tenant's key that reads like a line is a schedule of its own
    assert slots.reserve(f"{key}:line", interval, 0.0) == (True, 0.0)


def test_slots_in_one_process():
    spaced_by_the_interval(partial(lambda slots: slots, LocalSlots()))
    a_stale_line_is_forgotten_once_the_schedule_is_idle(LocalSlots())


@pytest.mark.both_stores
def test_slots_in_the_state_store(sas):
    spaced_by_the_interval(sas.store.rate_slots, sas.test_clock)
    a_stale_line_is_forgotten_once_the_schedule_is_idle(sas.store.rate_slots(), sas.test_clock.advance)


@pytest.mark.integration
def test_slots_in_redis():
    spaced_by_the_interval(lambda: RedisSlots(REDIS))
    a_stale_line_is_forgotten_once_the_schedule_is_idle(RedisSlots(REDIS))


# -- an agent with a limit, in the test kit (the store's schedule, on the virtual clock) ----------


def app_with_a_limit(tmp_path, limit: str, **options) -> tuple[SasApp, Workflow]:
    sas = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 'own.db'}", broker_url="memory://localhost/",
                          home=tmp_path / "home"))
    payment = sas.agent("payment", rate_limit=limit, **options)

    @payment.action
    def charge(call: AgentCall) -> dict[str, str]:
        return {"charged": call.business_key}

    return sas, sas.register(Workflow("order", [Step("charge", charge, timeout=30, max_failures=2)]))


@pytest.fixture
def sas_env(db_url, sas_env):
    return sas_env if db_url.startswith("sqlite") else partial(sas_env, database_url=db_url)


@pytest.mark.both_stores
def test_calls_are_spaced_by_the_limit(tmp_path, sas_env):
    sas, order = app_with_a_limit(tmp_path, "2/s")
    env = sas_env(sas)
    runs = [env.start(order, {}, business_key=f"o-{i}") for i in range(6)]
    views = [env.finish(run) for run in runs]

    assert [v.process_state for v in views] == ["processed"] * 6
    at = sorted(call.at for call in env.calls("payment.charge"))
    assert len(at) == 6 and all(later - earlier >= 0.5 - 1e-6 for earlier, later in pairwise(at)), at
    assert all(v.step("charge").failure_count == 0 for v in views)


@pytest.mark.both_stores
def test_a_call_whose_slot_is_far_off_defers_its_step_without_a_failure(tmp_path, sas_env):
    """At one call a minute and a 30 s step, the second call's slot is past what it may wait (a
    tenth of its time): its step is deferred — back in the store, no worker holding it, no failure — and
    called when its slot comes."""
    sas, order = app_with_a_limit(tmp_path, "1/m")
    env = sas_env(sas)
    first, second = env.start(order, {}, business_key="a"), env.start(order, {}, business_key="b")
    views = [env.finish(first), env.finish(second)]

    assert [v.process_state for v in views] == ["processed"] * 2
    at = sorted(call.at for call in env.calls("payment.charge"))
    assert len(at) == 2 and at[1] - at[0] >= 60 - 1e-6
    deferred = [e for v in views for e in v.events if e.kind == EventKind.TRANSITION.value
                and (e.detail or {}).get("reason") == "deferred"]
    assert deferred and all("rate limit of 1/m" in e.detail["message"] for e in deferred)
    assert all(v.step("charge").failure_count == 0 for v in views)



@pytest.mark.both_stores
def test_a_burst_far_past_the_limit_defers_each_step_once_and_in_order(tmp_path, sas_env):
    """Ten orders at once against one call a minute: the first is called, every other is deferred
    once, to a turn of its own a minute after the one before, and is called then — not sent back
    to be refused again each time the schedule looks like it has room (each time costing the step
    an attempt, two transactions and two messages)."""
    sas, order = app_with_a_limit(tmp_path, "1/m")
    env = sas_env(sas)
    runs = [env.start(order, {}, business_key=f"o-{i}") for i in range(10)]
    views = [env.finish(run) for run in runs]

    assert [v.process_state for v in views] == ["processed"] * 10
    at = sorted(call.at for call in env.calls("payment.charge"))
    assert len(at) == 10 and all(later - earlier >= 60 - 1e-6 for earlier, later in pairwise(at)), at
    deferrals = [sum(1 for e in v.events if (e.detail or {}).get("reason") == "deferred") for v in views]
    assert deferrals == [0] + [1] * 9, deferrals
    assert at[-1] - at[0] < 9 * 60 + 30, "each call at its turn, with no turn left unused between"


@pytest.mark.both_stores
def test_a_call_keeps_nine_tenths_of_its_steps_time_whatever_it_waited_for_its_slot(tmp_path, sas_env):
    """Waiting for a slot is not the call's time: a call waits in its worker at most a tenth of
    what its step has left, and a slot further off defers the step instead. (Waiting up to half
    of it left a service that takes 60 % of the timeout to finish past its complete-by, counted
    as a failed attempt.)"""
    sas = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 'own.db'}", broker_url="memory://localhost/",
                          home=tmp_path / "home"))
    payment = sas.agent("payment", rate_limit="15/m")  # a slot every 4 s
    left: list[float] = []

    @payment.action
    def charge(call: AgentCall) -> dict[str, float]:
        left.append(call.remaining())
        return {"left": left[-1]}

    order = sas.register(Workflow("order", [Step("charge", charge, timeout=20)]))
    env = sas_env(sas)
    views = [env.finish(run) for run in [env.start(order, {}, business_key=f"o-{i}") for i in range(3)]]

    assert [v.process_state for v in views] == ["processed"] * 3
    assert len(left) == 3 and min(left) >= 18 - 1e-6, left
    assert all(v.step("charge").failure_count == 0 for v in views)


@pytest.mark.both_stores
def test_with_a_key_each_tenant_has_the_limit_to_itself(tmp_path, sas_env):
    sas, order = app_with_a_limit(tmp_path, "1/s", rate_limit_key=lambda call: call.payload["tenant"])
    env = sas_env(sas)
    runs = [env.start(order, {"tenant": tenant}, business_key=f"{tenant}-{i}")
            for i in range(3) for tenant in ("acme", "globex")]
    for run in runs:
        env.finish(run)

    calls = env.calls("payment.charge")
    for tenant in ("acme", "globex"):
        at = sorted(c.at for c in calls if c.payload["tenant"] == tenant)
        assert len(at) == 3 and all(later - earlier >= 1 - 1e-6 for earlier, later in pairwise(at)), at
    first = sorted(c.at for c in calls)[:2]
    assert first[1] - first[0] < 0.5, "the other tenant's first call does not wait for this one's"
