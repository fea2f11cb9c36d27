"""Testing with sas_app.

Your workflows, in milliseconds: :class:`Environment` runs your app's workflows on the real engine
with a virtual clock that skips to the next thing due, an in-memory broker and stubbable agents
(the ``sas_env`` pytest fixture makes one). Your deployment, for real: :class:`Processes` starts and
stops its Celery workers, beat and services from a test, a demo or a benchmark,
:func:`stopped_by_signals` makes a script that started them stop them on Ctrl-C or SIGTERM, and
:func:`wait_until` waits on a condition with a bound.
"""

from sas_app.testing.clock import VirtualClock
from sas_app.testing.environment import Environment
from sas_app.testing.processes import Processes, Ready, Stopped, free_port, stopped_by_signals, wait_until
from sas_app.testing.stubs import HANG, WORKER_LOST, Call, StubExhausted

__all__ = [
    "HANG",
    "WORKER_LOST",
    "Call",
    "Environment",
    "Processes",
    "Ready",
    "Stopped",
    "StubExhausted",
    "VirtualClock",
    "free_port",
    "stopped_by_signals",
    "wait_until",
]
