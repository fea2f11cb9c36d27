"""The Scheduler's side of the pattern: the Scheduler's tasks (``scheduler``), what a run does next
(``planner``), its step graph (``graph``), steps that wait in the store (``waits``), what happens to
an attempt or a step that failed (``recovery``), and the alerts raised on the way (``alerts``).
"""
