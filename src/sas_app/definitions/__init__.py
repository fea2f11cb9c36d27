"""What a user writes: agent actions and the calls they receive (``actions``), the step kinds
(``steps``), a workflow made of them (``workflow``), and the checks a workflow passes when it is
registered (``checks``).
"""
