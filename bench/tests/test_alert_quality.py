"""The chaos run's judge of at-risk alerts: an alert is right when its step attempt then missed its
complete-by; an attempt that missed it waiting in its agent's queue (no worker received its message
before its complete-by) counts as foreseen only if its step was warned about first."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace as Row

import pytest

from bench.alert_quality import BACKLOG_GAP_S, Outage, judge, ready_times

pytestmark = pytest.mark.bench

RUN_A, RUN_B, RUN_C = "a" * 32, "b" * 32, "c" * 32
T0 = datetime(2026, 11, 24, 22, 25, 40).timestamp()


def dispatched(run_id: str, position: int, attempt: int, complete_by: float, timeout: float = 5.0) -> Row:
    return Row(kind="transition", run_id=run_id, position=position, attempt=attempt, from_state="not_started",
               to_state="running", detail={"complete_by": complete_by}, at=complete_by - timeout)


def expired(run_id: str, position: int, attempt: int, to_state: str = "pending") -> Row:
    detail = {"reason": "expired"} if to_state == "pending" else {"error": "complete-by passed"}
    return Row(kind="transition", run_id=run_id, position=position, attempt=attempt, from_state="running",
               to_state=to_state, detail=detail)


def at_risk(run_id: str, position: int, attempt: int, at: float, queue: str = "sas.agent.warehouse") -> Row:
    return Row(kind="at_risk", run_id=run_id, position=position, attempt=attempt, at=at,
               reason=f"step 'ship' is likely to miss its complete-by: ... on {queue}")


def received(run_id: str, position: int, attempt: int, at: float, task: str = "sas.agent.warehouse.ship") -> str:
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return f"[{stamp}: INFO/MainProcess] Task {task}[{run_id}-{position}-{attempt}] received\n"


def test_precision_counts_alerts_whose_attempt_missed_and_recall_the_queue_misses_warned_first():
    events = [
        dispatched(RUN_A, 1, 1, T0 + 5), expired(RUN_A, 1, 1),   # warned, then received too late
        dispatched(RUN_B, 0, 2, T0 + 5), expired(RUN_B, 0, 2, to_state="failed"),  # too late, never warned
        dispatched(RUN_C, 0, 1, T0 + 5), expired(RUN_C, 0, 1),   # received in time by a worker that froze
        dispatched(RUN_C, 1, 1, T0 + 5),
        Row(kind="transition", run_id=RUN_C, position=1, attempt=1, from_state="running", to_state="pending",
            detail={"reason": "worker_lost"}),                  # its worker died: not a complete-by missed
        dispatched(RUN_B, 1, 1, T0 + 5),                          # finished in time
    ]
    alerts = [at_risk(RUN_A, 1, 1, T0 + 1),
              at_risk(RUN_B, 1, 1, T0 + 3),   # cried wolf
              at_risk(RUN_C, 0, 1, T0 + 2),   # right, though not a queue's miss
              Row(kind="failed", run_id=RUN_B, position=0, attempt=2, at=T0 + 4)]    # another kind: not judged
    logs = {"agent0": received(RUN_A, 1, 1, T0 + 5.2) + received(RUN_B, 0, 2, T0 + 6) + received(RUN_B, 1, 1, T0 + 1),
            "agent1": received(RUN_C, 0, 1, T0 + 1) + received(RUN_C, 0, 1, T0 + 40)   # redelivered later: first counts
            + received(RUN_C, 1, 1, T0 + 9)}

    result = judge(alerts, events, logs)
    assert result.pop("wrong_at") == [T0 + 3] and result.pop("unforeseen_at") == [T0 + 5]
    assert result == {
        "alerts": 3, "alerts_whose_step_missed": 2, "precision": 0.667,
        "incidents": 3, "incidents_with_a_miss": 2, "incident_precision": 0.667,
        "missed_waiting_in_queue": 2, "missed_after_an_alert": 1, "recall": 0.5,
        "backlogs": 1, "backlogs_told": 1, "backlog_recall": 1.0,
        "missed_in_outages": 0, "recall_with_outages": 0.5, "missed_other_ways": 1, "missed_out_of_line": 0,
        "wrong_within_margin": 0, "unforeseen_within_margin": 0,
    }


def test_a_step_received_past_its_complete_by_and_run_all_the_same_missed_it():
    """An agent that cannot read the database's clock (PostgreSQL refusing new connections) runs a
    step from its receipt, and the Supervisor, refused too, has not expired it when it completes:
    nobody gave it up, but it was taken from its queue seconds past its complete-by. The alert that
    foresaw it was right; a step completed after a receipt in time was not late."""
    def completed(run_id: str, position: int) -> Row:
        return Row(kind="transition", run_id=run_id, position=position, attempt=1, from_state="running",
                   to_state="completed", detail={})

    events = [dispatched(RUN_A, 1, 1, T0 + 5), completed(RUN_A, 1),   # received at T0 + 9.5, run, completed
              dispatched(RUN_B, 1, 1, T0 + 5), completed(RUN_B, 1)]   # received in time
    alerts = [at_risk(RUN_A, 1, 1, T0 + 4.9), at_risk(RUN_B, 1, 1, T0 + 4.9)]
    logs = {"agent0": received(RUN_A, 1, 1, T0 + 9.5) + received(RUN_B, 1, 1, T0 + 4.95)}

    result = judge(alerts, events, logs)
    assert (result["alerts_whose_step_missed"], result["precision"]) == (1, 0.5)
    assert (result["missed_waiting_in_queue"], result["recall"]) == (1, 1.0)


def test_the_steps_that_made_it_or_missed_by_less_than_the_margin_are_counted():
    """A queue at capacity: which steps reach its head just in time is a coin toss. The wrong
    alerts and the unforeseen misses that were a fraction of a second from the other outcome are
    told apart from those the forecast got plainly wrong."""
    events = [dispatched(RUN_A, 0, 1, T0 + 5), dispatched(RUN_B, 0, 1, T0 + 5),      # both in time
              dispatched(RUN_C, 0, 1, T0 + 5), expired(RUN_C, 0, 1),                 # missed by 0.3 s
              dispatched(RUN_C, 1, 1, T0 + 5), expired(RUN_C, 1, 1)]                 # missed by 2 s
    alerts = [at_risk(RUN_A, 0, 1, T0 + 3), at_risk(RUN_B, 0, 1, T0 + 3)]
    logs = {"agent0": received(RUN_A, 0, 1, T0 + 4.8) + received(RUN_B, 0, 1, T0 + 3.5)
            + received(RUN_C, 0, 1, T0 + 5.3) + received(RUN_C, 1, 1, T0 + 7)}
    result = judge(alerts, events, logs)
    assert (result["precision"], result["recall"]) == (0.0, 0.0)
    assert (result["wrong_within_margin"], result["unforeseen_within_margin"]) == (1, 1)


def test_an_alert_raised_for_a_later_attempt_did_not_foresee_an_earlier_miss():
    events = [dispatched(RUN_A, 0, 1, T0 + 5), expired(RUN_A, 0, 1), dispatched(RUN_A, 0, 2, T0 + 12),
              expired(RUN_A, 0, 2)]
    alerts = [at_risk(RUN_A, 0, 2, T0 + 10)]
    result = judge(alerts, events, {"agent0": received(RUN_A, 0, 1, T0 + 6) + received(RUN_A, 0, 2, T0 + 13)})
    assert (result["missed_waiting_in_queue"], result["missed_after_an_alert"], result["precision"]) == (2, 1, 1.0)


def test_a_backlog_is_told_if_any_of_its_misses_was_warned_of_first():
    """What an operator hears of is a queue's backlog, not each of its steps: one queue's misses
    less than BACKLOG_GAP_S apart are one backlog, told if a step of it was warned of first."""
    events = [dispatched(RUN_A, 0, 1, T0 + 5), expired(RUN_A, 0, 1),       # warehouse, warned
              dispatched(RUN_A, 1, 1, T0 + 6), expired(RUN_A, 1, 1),       # the same backlog, not warned
              dispatched(RUN_B, 0, 1, T0 + 6), expired(RUN_B, 0, 1),       # payment: a backlog of its own
              dispatched(RUN_C, 0, 1, T0 + 6 + BACKLOG_GAP_S), expired(RUN_C, 0, 1)]  # warehouse, later: another
    logs = {"agent0": received(RUN_A, 0, 1, T0 + 6) + received(RUN_A, 1, 1, T0 + 7)
            + received(RUN_B, 0, 1, T0 + 7, task="sas.agent.payment.charge")
            + received(RUN_C, 0, 1, T0 + 12 + BACKLOG_GAP_S)}
    result = judge([at_risk(RUN_A, 0, 1, T0 + 4)], events, logs)
    assert (result["missed_waiting_in_queue"], result["recall"]) == (4, 0.25)
    assert (result["backlogs"], result["backlogs_told"], result["backlog_recall"]) == (3, 1, 0.333)


def test_nothing_to_judge_is_none_not_a_perfect_score():
    result = judge([], [], {})
    assert (result["precision"], result["recall"], result["backlog_recall"]) == (None, None, None)


def test_misses_held_up_by_the_broker_down_or_a_frozen_worker_are_no_backlog_to_foresee():
    """The broker down while an attempt waited (or its workers reconnecting just after), or the
    message received by a worker frozen with it in hand: counted apart, not in the recall."""
    events = [dispatched(RUN_A, 0, 1, T0 + 5), expired(RUN_A, 0, 1),     # waited through the outage
              dispatched(RUN_A, 1, 1, T0 + 25), expired(RUN_A, 1, 1),    # sent after it: a backlog's
              dispatched(RUN_B, 0, 1, T0 + 35), expired(RUN_B, 0, 1),    # in the zombie's hand
              dispatched(RUN_C, 0, 1, T0 + 35), expired(RUN_C, 0, 1),    # another worker meanwhile: a backlog's
              dispatched(RUN_C, 1, 1, T0 + 5), expired(RUN_C, 1, 1)]     # in the outage, but late without it too
    logs = {"agent0": received(RUN_A, 0, 1, T0 + 10) + received(RUN_A, 1, 1, T0 + 26) + received(RUN_C, 1, 1, T0 + 30),
            "agent1": received(RUN_B, 0, 1, T0 + 38.2),
            "agent2": received(RUN_C, 0, 1, T0 + 36)}
    outages = [Outage(T0 + 2, T0 + 9), Outage(T0 + 30, T0 + 38, worker="agent1")]
    alerts = [at_risk(RUN_C, 0, 1, T0 + 31)]

    result = judge(alerts, events, logs, outages=outages)

    counted = (result["missed_in_outages"], result["missed_waiting_in_queue"], result["missed_after_an_alert"])
    assert counted == (2, 3, 1)
    assert (result["recall"], result["recall_with_outages"]) == (0.333, 0.2)


def test_an_incident_is_a_queues_alerts_of_one_sweep_and_cried_wolf_only_if_none_of_its_steps_missed():
    """What the operator is told: one alert per queue and sweep. Of a backlog's steps at the margin,
    which get a worker just in time is a coin toss; the incident was real if any of them missed."""
    events = [dispatched(RUN_A, 0, 1, T0 + 5), expired(RUN_A, 0, 1),   # missed
              dispatched(RUN_B, 0, 1, T0 + 5),                          # made it
              dispatched(RUN_C, 0, 1, T0 + 5),                          # made it
              dispatched(RUN_C, 1, 1, T0 + 9)]                          # made it
    alerts = [at_risk(RUN_A, 0, 1, T0 + 1), at_risk(RUN_B, 0, 1, T0 + 1),              # one sweep, one queue
              at_risk(RUN_C, 0, 1, T0 + 1, queue="sas.agent.payment"),                # the same sweep, another
              at_risk(RUN_C, 1, 1, T0 + 2)]                                           # the next sweep

    result = judge(alerts, events, {})

    assert (result["alerts"], result["alerts_whose_step_missed"], result["precision"]) == (4, 1, 0.25)
    assert (result["incidents"], result["incidents_with_a_miss"], result["incident_precision"]) == (3, 1, 0.333)


def test_a_worker_away_holds_up_the_others_messages_for_its_share_of_the_queues_workers():
    """Two of three workers killed for 3 s: the queue drained at a third of its pace meanwhile, so
    a message received 1.5 s past its complete-by lost 2 s to them (two thirds of 3 s) and would
    have made it: the kills', not a backlog's. One received 2.5 s late would have missed anyway."""
    events = [dispatched(RUN_A, 0, 1, T0 + 5), expired(RUN_A, 0, 1),
              dispatched(RUN_B, 0, 1, T0 + 5), expired(RUN_B, 0, 1)]
    logs = {"agent2": received(RUN_A, 0, 1, T0 + 6.5) + received(RUN_B, 0, 1, T0 + 7.5)}
    outages = [Outage(T0 + 1, T0 + 4, worker="agent0", share=1 / 3, settle=0.0),
               Outage(T0 + 1, T0 + 4, worker="agent1", share=1 / 3, settle=0.0)]

    result = judge([], events, logs, outages=outages)

    assert (result["missed_in_outages"], result["missed_waiting_in_queue"]) == (1, 1)


def test_a_worker_restarted_is_away_until_its_log_says_it_is_ready():
    log = ("[2026-11-24 22:25:40,100: INFO/MainProcess] celery@agent0 ready.\n"
           "[2026-11-24 22:25:41,000: INFO/MainProcess] Task sas.agent.x[...] received\n"
           "[2026-11-24 22:25:52,250: INFO/MainProcess] celery@agent0 ready.\n")
    assert ready_times(log) == [T0 + 0.1, T0 + 12.25]


def test_a_message_a_killed_worker_took_was_not_in_line_and_no_backlog_missed_it():
    """A worker SIGKILLed just after it took a message logs no receipt; the broker gives the message
    back at its visibility timeout, long past its complete-by. It was not waiting in line — a
    message sent after it on its queue was received in time — so no forecast of the queue could
    see it."""
    events = [dispatched(RUN_A, 0, 1, T0 + 5), expired(RUN_A, 0, 1),     # taken by agent1, killed at T0 + 0.1
              dispatched(RUN_B, 0, 1, T0 + 6)]                          # sent a second later, received in time
    logs = {"agent0": received(RUN_B, 0, 1, T0 + 1.5),
            "agent1": received(RUN_A, 0, 1, T0 + 30)}                    # redelivered at the visibility timeout
    killed = [Outage(T0 + 0.1, T0 + 3, worker="agent1", share=1 / 3, settle=0.0)]

    result = judge([], events, logs, outages=killed)
    assert (result["missed_waiting_in_queue"], result["missed_out_of_line"], result["missed_other_ways"]) == (0, 1, 1)
    # no worker went away meanwhile: the order it was received in is the publishers' race, not a hand
    result = judge([], events, logs)
    assert (result["missed_waiting_in_queue"], result["missed_out_of_line"]) == (1, 0)


def test_a_late_message_overtaken_by_an_undo_or_by_none_in_its_line_was_waiting_in_line():
    """Undos jump the line; a message sent within OVERTAKE_S after it (the publishers race), one
    received after its complete-by, or one on another queue does not say it had left the line."""
    compensating = Row(kind="transition", run_id=RUN_C, position=None, attempt=None, from_state="processing",
                       to_state="compensating", detail={"reason": "failed"}, at=T0 + 0.5)
    late = [dispatched(RUN_A, 0, 1, T0 + 5), expired(RUN_A, 0, 1)]
    killed = [Outage(T0 + 0.1, T0 + 3, worker="agent1", share=1 / 3, settle=0.0)]
    redelivered = {"agent1": received(RUN_A, 0, 1, T0 + 30)}
    followers = {
        "an undo": ([compensating, dispatched(RUN_C, 3, 1, T0 + 11, timeout=10)],
                    received(RUN_C, 3, 1, T0 + 1.2, task="sas.agent.warehouse.unship")),
        "sent just after": ([dispatched(RUN_B, 0, 1, T0 + 5.1)], received(RUN_B, 0, 1, T0 + 1.2)),
        "received too late": ([dispatched(RUN_B, 0, 1, T0 + 6)], received(RUN_B, 0, 1, T0 + 5.5)),
        "on another queue": ([dispatched(RUN_B, 0, 1, T0 + 6)],
                             received(RUN_B, 0, 1, T0 + 1.5, task="sas.agent.payment.charge")),
    }
    for why, (events, log) in followers.items():
        result = judge([], late + events, {"agent0": log, **redelivered}, outages=killed)
        assert (result["missed_waiting_in_queue"], result["missed_out_of_line"]) == (1, 0), why


def test_a_message_a_frozen_worker_held_is_the_outage_s_not_out_of_line():
    """A worker frozen with a message it had not logged yet logs it when it thaws: the freeze held
    it up (an outage), though messages sent after it were received meanwhile."""
    events = [dispatched(RUN_A, 0, 1, T0 + 5), expired(RUN_A, 0, 1), dispatched(RUN_B, 0, 1, T0 + 6)]
    logs = {"agent0": received(RUN_B, 0, 1, T0 + 1.5), "agent1": received(RUN_A, 0, 1, T0 + 8)}
    frozen = [Outage(T0 + 0.1, T0 + 7.9, worker="agent1", share=1 / 3)]
    result = judge([], events, logs, outages=frozen)
    assert (result["missed_in_outages"], result["missed_out_of_line"], result["missed_waiting_in_queue"]) == (1, 0, 0)
