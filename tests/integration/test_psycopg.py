"""The state store through psycopg 3 (``postgresql+psycopg://``) as well as psycopg2: runs go
through, a submitter waiting on a run hears of its end, and the hot statements are prepared as
through psycopg2, under names their text gives, never psycopg 3's own (test_prepared.py has a
pooler that loses them cost one transaction through either)."""

from __future__ import annotations

import time

import pytest

from sas_app import SasApp, Settings, migrate
from sas_app.store import Store
from tests.support import Pump, through_psycopg_3
from tests.testapp import install_test_workflows

pytestmark = pytest.mark.integration


@pytest.fixture
def psycopg_url(db_url: str) -> str:
    """This test's database, reached through psycopg 3."""
    return through_psycopg_3(db_url)


def test_runs_go_through_and_a_waiting_submitter_hears_of_their_end(psycopg_url, tmp_path):
    app = SasApp(Settings(database_url=psycopg_url, broker_url="memory://localhost/", home=tmp_path,
                          task_events=False, inline_replies=False))
    install_test_workflows(app, timeout=10)
    app.migrate()
    pump = Pump(app)
    pump.purge()
    try:
        with app.store.listen_for_finished_runs() as listen:
            assert listen is not None
            started = time.monotonic()
            assert listen(0.3) == set()  # nothing ended: it waits its time out, no longer
            assert 0.25 <= time.monotonic() - started < 5
            handles = [app.submit("three", {}, business_key=f"p3-{i}") for i in range(3)]
            pump.run()
            heard: set[str] = set()
            deadline = time.monotonic() + 10
            while len(heard) < 3 and time.monotonic() < deadline:
                heard |= listen(deadline - time.monotonic())
        assert heard == {h.id for h in handles}
        assert [h.wait(10).process_state for h in handles] == ["processed"] * 3
    finally:
        app.store.dispose()


@pytest.mark.parametrize("prepared", [True, False])
def test_psycopg_3_prepares_under_each_statements_own_name_or_not_at_all(psycopg_url, prepared):
    """As through psycopg2: each hot statement prepared under a name its text gives, or nothing with
    SAS_PREPARED_STATEMENTS off. Never psycopg 3's own _pg3_0, _pg3_1…, counted in each process:
    behind a pooler in transaction mode a process could run another's statement of that name."""
    migrate(psycopg_url)
    store = Store(psycopg_url, prepared=prepared)
    try:
        for _ in range(8):  # psycopg 3 would prepare a statement the fifth time a connection runs it
            with store.begin() as tx:
                assert tx.runs.lock_run("no-such-run") is None
        with store.engine.connect() as conn:  # the same connection: the process's only one
            names = list(conn.exec_driver_sql("SELECT name FROM pg_prepared_statements").scalars())
        assert len(names) == (1 if prepared else 0) and all(name.startswith("sas_") for name in names)
    finally:
        store.dispose()
