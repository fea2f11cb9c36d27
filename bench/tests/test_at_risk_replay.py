"""The at-risk forecast replayed on a kept chaos run's record: what each queue held at a moment is
rebuilt from the dispatches and the workers' ``received`` lines, so that a change of the forecast
is judged against what happened without running the stack again."""

from __future__ import annotations

import pickle
from datetime import datetime
from pathlib import Path

import pytest

from bench.alert_quality import Outage
from bench.at_risk_replay import Record, judged, mean_of, own_looks, replay
from bench.chaos import JUDGED
from bench.tests.test_alert_quality import T0, dispatched, expired, received

pytestmark = pytest.mark.bench


def kept_run(home: Path, sent: int, received_first: int, outages: list[Outage] | None = None) -> Path:
    """A run whose ``sent`` warehouse steps were dispatched 0.1 s apart from T0 with 5 s each; a
    worker received the first ``received_first`` at T0 + 1 and the rest at T0 + 9, past their
    complete-by (expired, their messages dropped unworked)."""
    runs = [f"{i:032x}" for i in range(sent)]
    events = [vars(dispatched(run, 0, 1, T0 + 5 + i * 0.1)) for i, run in enumerate(runs)]
    events += [vars(expired(run, 0, 1)) | {"at": T0 + 5 + i * 0.1}
               for i, run in enumerate(runs) if i >= received_first]
    log = "".join(received(run, 0, 1, T0 + 1 if i < received_first else T0 + 9) for i, run in enumerate(runs))
    steps = [{"run_id": run, "position": 0, "agent": "warehouse", "name": "ship", "timeout": 5.0,
              "compensates": None, "completed_at": T0 + 1.5 if i < received_first else None}
             for i, run in enumerate(runs)]
    with open(home / JUDGED, "wb") as out:
        pickle.dump({"started_at": T0, "outages": outages or [], "timeline": [], "agents": ["agent0"],
                     "logs": {"agent0": log}, "alerts": [], "events": events, "steps": steps}, out)
    return home


def test_a_queue_holds_the_last_dispatched_of_its_running_steps_until_a_worker_receives_them(tmp_path):
    record = Record(kept_run(tmp_path, sent=4, received_first=1))
    assert [w.run_id[-1] for w in record.queue("warehouse", T0 + 0.5)] == ["0", "1", "2", "3"]
    assert [w.run_id[-1] for w in record.queue("warehouse", T0 + 1.2)] == ["1", "2", "3"]  # head first
    assert record.queue("warehouse", T0 - 1) == [] and record.queue("warehouse", T0 + 9.5) == []
    assert record.completions("warehouse", T0 + 2) == [T0 + 1.5]


def test_a_message_no_worker_received_waits_until_the_broker_is_emptied(tmp_path):
    """A FLUSHALL (or a purge) takes the messages still waiting: they were never received, and
    until then they were in line as much as the others (left out, a chaos run's backlog just
    before a FLUSHALL replayed a third as deep as the Supervisor read it)."""
    home = kept_run(tmp_path, sent=4, received_first=2)
    with open(home / JUDGED, "rb") as f:
        data = pickle.load(f)
    data["logs"]["agent0"] = "".join(line + "\n" for line in data["logs"]["agent0"].splitlines()[:2])
    data["timeline"] = [{"at": 3.0, "kind": "empty_broker", "detail": "FLUSHALL", "took_s": 0.01}]
    with open(home / JUDGED, "wb") as out:
        pickle.dump(data, out)
    record = Record(home)
    assert record.depth("warehouse", T0 + 0.5) == 4
    assert [w.run_id[-1] for w in record.queue("warehouse", T0 + 2)] == ["2", "3"]  # after the first two
    assert record.depth("warehouse", T0 + 3.5) == 0 and record.queue("warehouse", T0 + 3.5) == []


def test_a_message_not_received_before_one_sent_after_it_was_not_in_line(tmp_path):
    # the second of four never received, the others received at T0 + 1: its publish failed (or a
    # worker took it and died), so it waited nowhere once the third was received
    home = kept_run(tmp_path, sent=4, received_first=4)
    with open(home / JUDGED, "rb") as f:
        data = pickle.load(f)
    data["logs"]["agent0"] = "".join(line + "\n" for i, line in enumerate(data["logs"]["agent0"].splitlines())
                                     if i != 1)
    with open(home / JUDGED, "wb") as out:
        pickle.dump(data, out)
    record = Record(home)
    assert record.depth("warehouse", T0 + 0.5) == 4
    assert record.depth("warehouse", T0 + 1.5) == 0


def test_a_replay_raises_each_step_once_and_judges_it_as_the_run_was_judged(tmp_path):
    record = Record(kept_run(tmp_path, sent=4, received_first=1))

    def tail_of_the_queue(queued, now, completed, every, seen_since, taken):  # calls the last step at risk
        return list(queued[-1:])

    alerts = replay(record, tail_of_the_queue, every=1.0)
    # looks a second apart from the first dispatch: the first alone at T0, the last from T0 + 1 on,
    # each once however many looks saw it there
    assert [(a.run_id[-1], a.at - T0) for a in alerts] == [("0", 0.0), ("3", 1.0)]
    assert alerts[0].reason.endswith("on sas.agent.warehouse")
    assert judged(record, alerts)["precision"] == 0.5  # the first was received in time, the last expired
    everything = replay(record, lambda queued, now, completed, every, seen_since, taken: list(queued), every=1.0)
    assert judged(record, everything)["precision"] == 0.75


def test_no_look_reads_a_queue_while_the_broker_is_down_and_phases_move_the_looks(tmp_path):
    # the broker down from T0 + 0.5 to T0 + 2: the Supervisor read no depth then, and raised nothing
    record = Record(kept_run(tmp_path, sent=30, received_first=1, outages=[Outage(T0 + 0.5, T0 + 2)]))

    def tail_of_the_queue(queued, now, completed, every, seen_since, taken):
        return list(queued[-1:])

    alerts = replay(record, tail_of_the_queue, every=1.0)
    # looks at T0 and T0 + 3 (those at T0 + 1 and T0 + 2 fell in the outage)
    assert [round(a.at - T0, 1) for a in alerts] == [0.0, 3.0]
    # a quarter of a second later, the looks are at T0 + 0.25, T0 + 2.25, ... (T0 + 1.25 in the outage)
    later = replay(record, tail_of_the_queue, phase=0.25, every=1.0)
    assert [round(a.at - T0, 2) for a in later][:3] == [0.25, 2.25, 3.25]
    assert mean_of([{"precision": 0.5, "recall": None}, {"precision": 1.0, "recall": None}]) == {
        "precision": 0.75, "recall": None}


def test_a_step_warned_of_is_not_warned_of_again_on_a_later_attempt(tmp_path):
    # as the Supervisor's at-risk alerts are deduplicated: one a step, whatever its attempt
    home = kept_run(tmp_path, sent=2, received_first=0)
    with open(home / JUDGED, "rb") as f:
        data = pickle.load(f)
    retry = dispatched(f"{0:032x}", 0, 2, T0 + 12)  # the first step's second attempt, sent at T0 + 7
    data["events"].append(vars(retry))
    with open(home / JUDGED, "wb") as out:
        pickle.dump(data, out)
    record = Record(home)
    alerts = replay(record, lambda queued, now, completed, every, seen_since, taken: list(queued), every=1.0)
    assert sorted((a.run_id[-1], a.attempt) for a in alerts) == [("0", 1), ("1", 1)]


def test_a_replay_tells_the_forecast_when_its_looks_found_the_queue_shorter(tmp_path):
    record = Record(kept_run(tmp_path, sent=4, received_first=1))
    seen: dict[float, list[float]] = {}

    def noting(queued, now, completed, every, seen_since, taken):
        seen[round(now - T0, 1)] = [(round(a - T0, 1), round(b - T0, 1)) for a, b in taken]
        return []

    replay(record, noting, every=0.5)
    # the four sent by T0 + 0.3, the first received at T0 + 1: the look then found the queue
    # shorter than the one before
    assert seen[0.5] == [] and seen[1.0] == seen[1.5] == seen[8.5] == [(0.5, 1.0)]


def looked(at: float, took: float = 0.01, found: str = "warehouse 3 waiting, 2.0/s, 0 at risk") -> str:
    """The Supervisor worker's debug line for a look that judged at ``at`` (epoch seconds), having
    read the queues a moment before."""
    end = datetime.fromtimestamp(at + took).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return f"[{end}: DEBUG/MainProcess] look at {at:.3f} (queues read at {at - 0.002:.3f}): {found}\n"


def test_a_replay_at_the_runs_own_looks_judges_what_each_read_and_each_start_of_the_worker_saw(tmp_path):
    """A run's own looks are replayed with the depths they read, counting the steps dispatched by
    the time they read them (as the Supervisor does); a restarted Supervisor worker knows nothing
    of what its looks saw before; skipped looks are not looks, and one that found nothing waiting
    read every queue empty."""
    record = Record(kept_run(tmp_path, sent=4, received_first=1))
    nothing = datetime.fromtimestamp(T0 + 1.4).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    log = ("--- start 10:00:00 sas worker -Q sas.supervisor\n" + looked(T0 + 0.2, found="warehouse 2 waiting")
           + looked(T0 + 0.9, found="warehouse 4 waiting")
           + "[x: DEBUG/MainProcess] look skipped: another was taken less than 0.05s ago\n"
           + "--- start 10:00:01 sas worker -Q sas.supervisor\n" + looked(T0 + 1.2, found="warehouse 3 waiting")
           + looked(T0 + 1.3, found="warehouse 2 waiting")
           + f"[{nothing}: DEBUG/MainProcess] look: no message waits\n" + "[x: INFO/MainProcess] other\n")
    looks = own_looks(log)
    assert [(round(at - T0, 2), start, depths) for at, start, depths, _ in looks] == [
        (0.2, "1", {"warehouse": 2}), (0.9, "1", {"warehouse": 4}), (1.2, "2", {"warehouse": 3}),
        (1.3, "2", {"warehouse": 2}), (1.4, "2", {})]
    seen: list[tuple[float, list, list]] = []

    def noting(queued, now, completed, every, seen_since, taken):
        seen.append((round(now - T0, 1), [w.run_id[-1] for w in queued],
                     [(round(a - T0, 1), round(b - T0, 1)) for a, b in taken]))
        return []

    replay(record, noting, looks=looks)
    # dispatched 0.1 s apart from T0: at T0 + 0.2 (read at T0 + 0.198) two were, and they wait;
    # the queue read shorter at T0 + 1.2 than at T0 + 0.9, but by another start of the worker
    assert seen == [(0.2, ["0", "1"], []), (0.9, ["0", "1", "2", "3"], []), (1.2, ["1", "2", "3"], []),
                    (1.3, ["2", "3"], [(1.2, 1.3)])]
