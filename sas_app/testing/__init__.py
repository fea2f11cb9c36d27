"""Testing with sas_app: start and stop the real processes of a deployment — Celery workers and beat,
and any command such as a simulated remote service — from a test, a demo or a benchmark
(:class:`Processes`), and wait on a condition with a bound (:func:`wait_until`).
"""

from sas_app.testing.processes import Processes, Ready, Stopped, free_port, wait_until

__all__ = ["Processes", "Ready", "Stopped", "free_port", "wait_until"]
