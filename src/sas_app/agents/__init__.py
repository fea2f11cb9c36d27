"""The Agent's side of the pattern: an agent wrapping one remote service, its actions and undos as
Celery tasks (``agent``), and the circuit breaker its workers share (``breaker``).
"""
