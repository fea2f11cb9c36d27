"""One completion path, two dialects: the same sequences on SQLite (the step-by-step path) and on
PostgreSQL (the one-statement hot path where it applies) leave the same rows, events and
notifications. Times, ids and run ids differ between the two and are left out of the comparison."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import create_engine, event, select, text
from sqlalchemy.pool import NullPool

from sas_app import SasApp, Settings
from sas_app.store.prepared import built
from sas_app.store.tables import outbox
from tests.support import Pump
from tests.testapp import install_test_workflows

pytestmark = pytest.mark.integration

TIMES = {"complete_by", "backoff"}
RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")


def parity_app(url: str, home: Any, *, inline_replies: bool = False) -> SasApp:
    """An app on ``url`` with the test workflows, migrated; its messages go through memory."""
    app = SasApp(Settings(database_url=url, broker_url="memory://localhost/", home=home, pickup_timeout=30,
                          task_events=False, inline_replies=inline_replies))
    install_test_workflows(app, timeout=30)
    app.migrate()
    return app


def sequences(app: SasApp) -> dict[str, Any]:
    """Run every sequence and return what the store holds for each run, by business key."""
    pump = Pump(app)
    pump.purge()
    keys: dict[str, str] = {}
    one_statement: list[str] = []
    narrower: list[str] = []  # of those, the ones for a run that notifies no one
    in_graph: list[str] = []
    started: list[str] = []

    @event.listens_for(app.store.engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, sent: str, parameters: Any, context: Any, *args: Any) -> None:
        statement = built(sent)  # as built: on PostgreSQL, what is sent is EXECUTE of it, prepared
        if statement.lstrip().startswith("WITH run AS"):
            one_statement.append(statement)
            if "run.reply_to IS NULL" in statement:
                narrower.append(statement)
        if statement.lstrip().startswith("WITH done AS"):
            in_graph.append(statement)
        if statement.lstrip().startswith("WITH new_run AS"):
            started.append(statement)

    def submit(workflow: str, key: str, payload: dict[str, Any] | None = None, *, quiet: bool = False) -> str:
        keys[key] = workflow
        return app.submit(workflow, payload or {}, business_key=key,
                          reply_to=None if quiet else "parity-replies").id

    # Each straight-line sequence twice: for a run with a reply queue, then for one that notifies
    # no one (on PostgreSQL its replies take the narrower statements)
    for quiet in (False, True):
        named = "quiet {}".format if quiet else str
        # the happy path, to the last step (the run's processed in the same statement on PostgreSQL)
        submit("three", named("happy"), quiet=quiet)
        pump.run()

        # a stale reply: the first step's reply delivered twice
        submit("three", named("stale"), quiet=quiet)
        pump.run(["sas.scheduler"])
        pump.run(["sas.agent.svc"])
        replies = pump.take("sas.scheduler")
        for message in replies + replies:
            pump.execute(message)
        pump.run()

        # a paused run: its step completes, nothing follows until it is resumed
        paused = submit("three", named("paused"), quiet=quiet)
        app.pause(paused, by="ops", reason="parity")
        pump.run()
        app.resume(paused, by="ops", reason="parity")
        pump.run()

        # an undo: the third step refused for good, the first two undone last first
        submit("saga", named("undo"), {"script": {"third": ["permanent"]}}, quiet=quiet)
        pump.run()

    # steps side by side and their join; a fan-out two at a time; one over an earlier result; a
    # branch failing for good while a sibling runs
    submit("diamond", "diamond")
    pump.run()
    submit("fanout", "fanout", {"items": ["a", "b", "c"]})
    pump.run()
    submit("fanout_result", "over a result", {"items_from_result": [1, 2]})
    pump.run()
    submit("fanout", "branch fails", {"items": ["a", "b", "c"], "script": {"ship[1]": ["permanent"]}})
    pump.run()
    # a child run, and one that fails (its parent undone)
    submit("parent", "child")
    pump.run()
    submit("parent", "child fails", {"script": {"k1": ["permanent"]}})
    pump.run()

    state: dict[str, Any] = {"completions in one statement": len(one_statement),
                             "narrower completions": len(narrower),
                             "graph completions in one statement": len(in_graph),
                             "runs started in one statement": len(started)}
    with app.store.engine.connect() as conn:
        notes = conn.execute(select(outbox.c.run_id, outbox.c.body).order_by(outbox.c.id)).all()
    for key, workflow in keys.items():
        run = app.store.find_run(workflow, key)
        assert run is not None
        state[key] = _scrub({
            "run": (run.process_state, run.failure_count, run.error, run.paused_by, run.locked_by is None),
            "steps": [_step(s) for s in app.store.get_steps(run.id)],
            "events": [(e.position, e.kind, e.from_state, e.to_state, e.attempt, e.actor, _detail(e.detail))
                       for e in app.store.get_events(run.id)],
            "notifications": [{k: v for k, v in body.items() if k not in ("id", "run_id")}
                              for run_id, body in notes if run_id == run.id],
        })
    return state


def _step(step: Any) -> tuple[Any, ...]:
    neutral = replace(step, id=0, run_id="", created_at=0.0, updated_at=0.0,
                      completed_at=None if step.completed_at is None else 0.0,
                      complete_by=None if step.complete_by is None else 0.0,
                      not_before=None if step.not_before is None else 0.0,
                      idempotency_key=step.idempotency_key.split(":", 1)[1],
                      result=_result(step.result))
    return tuple(vars(neutral).values())


def _scrub(value: Any) -> Any:
    """Run ids (a child's, in its parent's rows) replaced by ``<run>``: they differ between the two."""
    if isinstance(value, str):
        return RUN_ID.sub("<run>", value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_scrub(v) for v in value)
    return value


def _unkeyed(key: str, value: Any) -> Any:
    """``value`` with the business key ``key`` written ``<key>`` wherever it is a whole string."""
    if isinstance(value, str):
        return "<key>" if value == key else value
    if isinstance(value, dict):
        return {k: _unkeyed(key, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unkeyed(key, v) for v in value)
    return value


def _result(result: Any) -> Any:
    return {k: v for k, v in result.items() if k != "key"} if isinstance(result, dict) else result


def _detail(detail: Any) -> Any:
    if not isinstance(detail, dict):
        return detail
    return {k: ("<time>" if k in TIMES else v) for k, v in detail.items() if k != "run_id"}


def test_the_same_sequences_leave_the_same_rows_events_and_notifications_on_both_dialects(db_url, tmp_path):
    results = {}
    for name, url in (("sqlite", f"sqlite:///{tmp_path / 'parity.db'}"), ("postgresql", db_url)):
        app = parity_app(url, tmp_path / name)
        try:
            results[name] = sequences(app)
        finally:
            app.store.dispose()

    sqlite, postgresql = results["sqlite"], results["postgresql"]
    assert sqlite["happy"]["run"][0] == "processed" and sqlite["undo"]["run"][0] == "compensated"
    assert sum(e[1] == "stale_reply" for e in sqlite["stale"]["events"]) == 1
    assert sqlite["stale"]["run"][0] == "processed" and sqlite["paused"]["run"][0] == "processed"
    assert [sqlite[key]["run"][0] for key in ("quiet happy", "quiet stale", "quiet paused", "quiet undo")] == [
        "processed", "processed", "processed", "compensated"]
    assert sum(e[1] == "stale_reply" for e in sqlite["quiet stale"]["events"]) == 1
    assert not sqlite["quiet happy"]["notifications"] and sqlite["happy"]["notifications"]
    # On PostgreSQL every success reply tries the one statement first (it also takes the run's lock):
    # 14 on straight lines (3 + 3 and a duplicate + 3 + 2 and 2 undos), then 18 in graphs and 5 in
    # the runs with a child; the duplicate, the reply to the paused run and the undos then go step by
    # step, as on SQLite. A straight line's reply tries it as a transaction of its own, where the
    # duplicate and the undos change nothing and are tried again in a transaction: 3 more; and the
    # same 17 again for the quiet runs...
    assert (sqlite.pop("completions in one statement"), postgresql.pop("completions in one statement")) == (0, 57)
    # ... of which those for runs that notify no one are the narrower statements: the quiet runs'
    # 14 tries as a transaction of their own (the undos' among them, which change nothing), and the
    # child run's one step (a child has no reply queue)
    assert (sqlite.pop("narrower completions"), postgresql.pop("narrower completions")) == (0, 15)
    # ... and a graph's completions take one statement more: diamond 4, fanout 1 + 3 + 1, over a result
    # 1 + 2, and 2 where a branch fails (prepare, ship[0]; ship[2]'s late reply and the 3 undos are not),
    # and 2 + 1 in the parents of child runs (the children are straight lines)
    assert (sqlite.pop("graph completions in one statement"),
            postgresql.pop("graph completions in one statement")) == (0, 17)
    # every run is claimed and its first step (on a straight line) marked running in one statement:
    # the 16 runs (14 submitted, 2 children), and every later ask to advance a run tries it first
    assert (sqlite.pop("runs started in one statement"), postgresql.pop("runs started in one statement")) == (0, 20)
    assert sqlite["diamond"]["run"][0] == sqlite["fanout"]["run"][0] == "processed"
    assert sqlite["branch fails"]["run"][0] == "compensated"
    assert (sqlite["child"]["run"][0], sqlite["child fails"]["run"][0]) == ("processed", "compensated")
    for key in sqlite:
        assert postgresql[key] == sqlite[key], key


def test_a_step_in_a_graph_costs_one_statement_more_than_on_a_straight_line(db_url, tmp_path):
    """On PostgreSQL a reply completing a step on a straight line is one statement (the next step
    started in it) that is its own transaction: psycopg2 sends it with no BEGIN and no COMMIT. A
    branch's, which starts the next branch, is two statements (the run's lock, then the graph's)
    in one transaction."""
    app = parity_app(db_url, tmp_path / "home")
    pump = Pump(app)
    pump.purge()
    statements: list[bool] = []  # each statement: was it its own transaction (autocommit)?
    commits: list[int] = []
    backends: set[int] = set()  # the server processes of the statements' connections
    watcher = create_engine(db_url, poolclass=NullPool)

    def sent(conn: Any, *args: Any) -> None:
        statements.append(conn.connection.dbapi_connection.autocommit)
        backends.add(conn.connection.dbapi_connection.get_backend_pid())

    def last_sent() -> list[str]:
        """What each of those connections sent the server last."""
        with watcher.connect() as watch:
            return list(watch.execute(text("SELECT query FROM pg_stat_activity WHERE pid = ANY(:pids)"),
                                      {"pids": list(backends)}).scalars())

    event.listen(app.store.engine, "before_cursor_execute", sent)
    event.listen(app.store.engine, "commit", lambda conn: commits.append(1))

    def reply_cost() -> tuple[int, int, bool]:
        """Run the agents' calls waiting now, then count what handling the first reply costs
        the Scheduler (the other replies are handled after it): statements, commits, and whether
        each statement was a transaction of its own."""
        pump.run(["sas.agent.svc"])
        first, *others = pump.take("sas.scheduler")
        statements.clear()
        commits.clear()
        backends.clear()
        pump.execute(first)
        cost = len(statements), len(commits), all(statements)
        # and nothing more reached the server: SQLAlchemy, switching a pooled psycopg2 connection
        # back from autocommit, would send a SET of the session's isolation level on its return
        assert not [q for q in last_sent() if q.lstrip().upper().startswith("SET ")]
        for reply in others:
            pump.execute(reply)
        return cost

    try:
        app.submit("three", {}, business_key="line")
        pump.run(["sas.scheduler"])
        assert reply_cost() == (1, 1, True)  # "first" completes and "second" starts
        assert reply_cost() == (1, 1, True)  # again, on the same pooled connection
        pump.run()
        app.submit("fanout", {"items": [1, 2, 3]}, business_key="fan")  # two branches at a time
        pump.run(["sas.scheduler"])
        pump.run(["sas.agent.svc"])
        pump.run(["sas.scheduler"])  # "prepare" completes; the fan-out starts ship[0] and ship[1]
        assert reply_cost() == (2, 1, False)  # a branch completes and ship[2] starts
    finally:
        app.store.dispose()
        watcher.dispose()


def test_a_straight_line_submitted_where_it_is_started_is_written_started_in_one_statement(db_url, tmp_path):
    """With the Scheduler in the submitting process (SAS_INLINE_REPLIES), PostgreSQL writes a
    straight line already started — the run claimed, its first step running, three events — in
    one statement, where SQLite writes it and then claims it: the same rows and events after, and
    a business key submitted again writes nothing on either."""
    results = {}
    for name, url in (("sqlite", f"sqlite:///{tmp_path / 'parity.db'}"), ("postgresql", db_url)):
        app = parity_app(url, tmp_path / name, inline_replies=True)
        statements: list[str] = []

        def listener(conn: Any, cursor: Any, sent: str, *args: Any, seen: list[str] = statements) -> None:
            alone = getattr(conn.connection.dbapi_connection, "autocommit", False)  # psycopg2's; sqlite3's: None
            seen.append(("alone " if alone is True else "") + built(sent))

        event.listen(app.store.engine, "before_cursor_execute", listener)
        try:
            pump = Pump(app)
            pump.purge()
            keys = {"happy": "three", "undone": "saga", "graph": "diamond"}
            payloads = {"undone": {"script": {"third": ["permanent"]}}}
            cost = {}
            for key, workflow in keys.items():
                statements.clear()
                app.submit(workflow, payloads.get(key, {}), business_key=key)
                cost[key] = [s.split("(", 1)[0].split()[:4] for s in statements]
            statements.clear()
            again = app.submit("three", {}, business_key="happy")
            cost["again"] = len(statements)
            assert not again.created
            pump.run()
            event.remove(app.store.engine, "before_cursor_execute", listener)
            state: dict[str, Any] = {"cost": cost}
            for key, workflow in keys.items():
                run = app.store.find_run(workflow, key)
                assert run is not None
                state[key] = _scrub({
                    "run": (run.process_state, run.failure_count, run.error, run.paused_by, run.locked_by is None,
                            run.complete_by, run.deadline),
                    "steps": [_step(s) for s in app.store.get_steps(run.id)],
                    "events": [(e.position, e.kind, e.from_state, e.to_state, e.attempt, e.actor is None,
                                _detail(e.detail)) for e in app.store.get_events(run.id)],
                })
            results[name] = state
        finally:
            app.store.dispose()

    sqlite, postgresql = results["sqlite"], results["postgresql"]
    assert sqlite["happy"]["run"][0] == "processed" and sqlite["undone"]["run"][0] == "compensated"
    assert sqlite["graph"]["run"][0] == "processed"
    sqlite_cost, postgresql_cost = sqlite.pop("cost"), postgresql.pop("cost")
    # one statement that is its own transaction: no BEGIN, no COMMIT
    assert postgresql_cost["happy"] == postgresql_cost["undone"] == [["alone", "WITH", "run", "AS"]], postgresql_cost
    assert len(sqlite_cost["happy"]) >= 4 and len(postgresql_cost["graph"]) >= 4  # written, then claimed
    assert postgresql_cost["again"] == 2  # the taken key: the statement wrote nothing, the run read back
    for key in sqlite:
        assert postgresql[key] == sqlite[key], key


def test_a_reply_that_misjudges_its_run_changes_nothing_and_the_step_completes_all_the_same(db_url, tmp_path):
    """The narrower statements check what the reply believes of its run — that it notifies no
    one, that the step is its workflow's last — and change nothing where it is wrong; the reply
    then completes the step in a transaction. Wrong, here: a step message sent before messages
    said whether the run notifies anyone (so the agent replies that it does not), and a
    deployment whose definition of the workflow has one step less than the run's copy. Each run
    ends with the same steps, events and notifications as one that took no wrong turn."""
    app = parity_app(db_url, tmp_path / "home")
    pump = Pump(app)
    pump.purge()
    narrower: list[str] = []

    @event.listens_for(app.store.engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, sent: str, *args: Any) -> None:
        if "run.reply_to IS NULL" in built(sent):
            narrower.append(built(sent))

    def outcome(key: str) -> Any:
        run = app.store.find_run("three", key)
        assert run is not None and run.process_state == "processed", run
        with app.store.engine.connect() as conn:
            notes = conn.execute(select(outbox.c.body).where(outbox.c.run_id == run.id).order_by(outbox.c.id)).scalars()
            told = [{k: v for k, v in body.items() if k not in ("id", "run_id")} for body in notes]
        return _unkeyed(key, ([_step(s) for s in app.store.get_steps(run.id)],
                              [(e.position, e.kind, e.from_state, e.to_state, e.attempt, _detail(e.detail))
                               for e in app.store.get_events(run.id)], told))

    try:
        told = app.submit("three", {}, business_key="told", reply_to="hint-replies").id
        app.submit("three", {}, business_key="control told", reply_to="hint-replies")
        pump.run(["sas.scheduler"])
        for message in pump.take("sas.agent.svc"):
            if message.run_ids() == [told]:  # as a Scheduler sent it before messages said so
                assert message.kwargs.pop("notify") is True
            pump.execute(message)
        pump.run()
        assert len(narrower) == 1  # that reply's; every later message of the run says it notifies
        assert outcome("told") == outcome("control told")
        assert [n["kind"] for n in outcome("told")[2]] == [
            "received", "processing", "step_completed", "step_completed", "step_completed", "processed"]

        app.submit("three", {}, business_key="control")
        pump.run()
        narrower.clear()
        app.submit("three", {}, business_key="shorter")
        three = app.workflows["three"]
        app.workflows["three"] = replace(three, steps=three.steps[:2])  # then a shorter definition deployed
        try:
            pump.run()
        finally:
            app.workflows["three"] = three
        # "second" tried as the last (the run has a third) and "third" as one with a next
        assert len(narrower) == 3 and "run.slot IS NULL" in narrower[1] and "run.slot IS NULL" not in narrower[2]
        assert outcome("shorter") == outcome("control")
    finally:
        app.store.dispose()
