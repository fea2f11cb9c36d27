"""Which runs a page is about: the runs list's filter, read from a query string, shared by the list
and by the bulk actions' confirmation (so that both select exactly the same runs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from flask import abort
from werkzeug.datastructures import MultiDict

from sas_app.states import RUN_STATES

if TYPE_CHECKING:
    from sas_app.store import RunRow, Store


@dataclass(frozen=True)
class RunFilter:
    state: str | None = None
    workflow: str | None = None
    key: str | None = None
    version: str | None = None
    failure: str | None = None

    @classmethod
    def of(cls, args: MultiDict[str, str]) -> RunFilter:
        """From ``state``, ``workflow``, ``key`` (a business-key prefix), ``version`` and
        ``failure`` (words in the run's error); an empty field selects any. 400 for an unknown state."""
        state = args.get("state") or None
        if state is not None and state not in RUN_STATES:
            abort(400, f"unknown state {state!r}; one of {', '.join(RUN_STATES)}")
        return cls(state, *(args.get(name, "").strip() or None for name in ("workflow", "key", "version", "failure")))

    def runs(self, store: Store, limit: int) -> list[RunRow]:
        return store.list_runs(**asdict(self), limit=limit)

    def fields(self) -> dict[str, str]:
        """The fields set."""
        return {name: value for name, value in asdict(self).items() if value}

    def query(self) -> str:
        """The filter as a query string."""
        return urlencode(self.fields())

    def describe(self) -> str:
        """In words, for a confirmation: ``runs in error of order whose error says 'payment'``."""
        parts = [f"in {self.state}" if self.state else "", f"of {self.workflow}" if self.workflow else "",
                 f"of version {self.version}" if self.version else "",
                 f"whose business key starts with {self.key!r}" if self.key else "",
                 f"whose error says {self.failure!r}" if self.failure else ""]
        return " ".join(["runs", *filter(None, parts)]) if any(parts) else "all runs"
