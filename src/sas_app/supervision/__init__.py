"""The Supervisor's side of the pattern: the sweep that finds what is past due and asks the
Scheduler to act (``supervisor``), what waits in the broker's queues (``queue_depths``), and the
at-risk forecast (``forecast``), fenced behind one small interface and one setting.
"""
