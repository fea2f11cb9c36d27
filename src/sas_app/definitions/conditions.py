"""A step's condition: ``when=`` (it runs only if the condition holds) or ``unless=`` (only if it
does not), else it ends ``skipped``.

A condition is a key — of the payload (``"express"``) or of an earlier step's result
(``quote.output("express")``), true when its value is truthy (a key that is not there reads as
false) — or a function of a :class:`StepContext` returning a bool. A key is checked when the
workflow is registered and read by the engine from the run's own copy of the graph; a function is
the deployed code's, found by its step's name as an action is, and must be deterministic: it may
be asked again after a crash.

The same condition given to one step as ``when=`` and to another as ``unless=`` is an exclusive
choice: exactly one of the two runs.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Named(Protocol):
    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class StepContext:
    """What a condition is given: the run, its payload (or the step's edited input) and the
    results of the steps that have completed so far, by name (a skipped step has none)."""

    run_id: str
    business_key: str
    step: str
    payload: Any
    results: dict[str, Any]

    def result_of(self, step: Named | str) -> Any:
        """The result of an earlier step (the step object, or its name); a ``KeyError`` naming it
        when it has none (it was skipped, or has not completed)."""
        name = step if isinstance(step, str) else step.name
        if name not in self.results:
            raise KeyError(f"step {name!r} has no result (skipped, or not completed): the condition of "
                           f"{self.step!r} has those of {sorted(self.results) or 'no step'}")
        return self.results[name]


#: a condition written as code: true when the step should run (``when=``)
Condition = Callable[[StepContext], bool]


@dataclass(frozen=True)
class Guard:
    """A step's condition as the engine holds it: ``when`` or ``unless``, and a key (``path``:
    ``"express"`` in the payload, ``"quote.express"`` in a result) or a function (``fn``)."""

    unless: bool
    path: str | None = None
    fn: Condition | None = None

    @property
    def stored(self) -> str:
        """How each step row records it, and ``sas show`` displays it: ``when quote.express``,
        ``unless is_small()``."""
        what = self.path if self.fn is None else f"{function_name(self.fn)}()"
        return f"{'unless' if self.unless else 'when'} {what}"

    def fingerprint(self) -> str:
        """What the definition's version hashes: the condition, and a function's source (its
        compiled code where the source cannot be found), so that editing it is a new version."""
        if self.fn is None:
            return self.stored
        try:
            body = inspect.getsource(self.fn)
        except (OSError, TypeError):
            code = getattr(self.fn, "__code__", None)
            body = repr(self.fn) if code is None else code.co_code.hex() + repr(code.co_consts) + repr(code.co_names)
        return f"{self.stored} {hashlib.sha256(body.encode()).hexdigest()[:16]}"

    def holds(self, context: StepContext) -> bool:
        """Whether the step runs: the condition's truth, or its opposite for ``unless``. A
        function's exception propagates (the planner stops the run on it)."""
        if self.fn is not None:
            value: Any = self.fn(context)
        else:
            value = read_key(self.path or "", context.payload, context.results)
        return bool(value) != self.unless

    @classmethod
    def parse(cls, stored: str) -> Guard:
        """A stored key condition (a function's, ``... name()``, parses with ``fn`` None and
        ``path`` None: its code is the deployed workflow's)."""
        word, _, what = stored.partition(" ")
        return cls(unless=word == "unless", path=None if what.endswith("()") else what)


def function_name(fn: Condition) -> str:
    """A function as people read its name: ``priced_high``, ``Rules.priced_high``."""
    return str(getattr(fn, "__qualname__", None) or repr(fn)).replace("<locals>.", "")


def read_key(path: str, payload: Any, results: dict[str, Any]) -> Any:
    """The value at ``path`` — a payload key, or ``<step>.<key>`` of that step's result — or None
    when it is not there."""
    step, _, key = path.rpartition(".")
    container = results.get(step) if step else payload
    return container.get(key) if isinstance(container, dict) else None
