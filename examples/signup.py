"""Write your own workflow and agent: a sign-up that creates an account, then sends a welcome mail.

Run it (with SAS_* set as for any sas_app process):
    SAS_APP=examples.signup:sas sas worker &
    SAS_APP=examples.signup:sas sas beat &
    python -m examples.signup alice@example.com
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

from sas_app import AgentCall, PermanentError, SasApp, Step, TransientError, UndoCall, Workflow

sas = SasApp()  # settings from SAS_* variables: broker, state store, Supervisor interval...
celery = sas.celery  # so `celery -A examples.signup worker` finds the app too

# One agent per remote service. Here the "services" are files, so the example runs anywhere.
accounts = sas.agent("accounts")
mailer = sas.agent("mailer")
HOME = Path(os.environ.get("SAS_HOME", ".sas"))


@accounts.action
def create(call: AgentCall) -> dict[str, str]:
    email = call.payload["email"]
    if "@" not in email:
        raise PermanentError(f"not an email address: {email}")  # no retry; the run goes to error
    # The idempotency key is the same on every attempt: creating twice leaves one account.
    (HOME / "accounts").mkdir(parents=True, exist_ok=True)
    (HOME / "accounts" / call.idempotency_key).write_text(email)
    return {"account": call.idempotency_key}


@accounts.undo
def delete(call: UndoCall) -> dict[str, str]:
    # call.undoes: the step undone, and the idempotency key its effect was applied under
    (HOME / "accounts" / call.undoes.idempotency_key).unlink(missing_ok=True)
    return {"deleted": call.undoes.idempotency_key}


@mailer.action
def welcome(call: AgentCall) -> dict[str, str]:
    if call.try_number == 1 and call.payload.get("flaky_mailer"):
        raise TransientError("mail server busy")  # retried in-process with back-off: try 2 gets through
    sent = HOME / "sent.jsonl"
    line = json.dumps({"key": call.idempotency_key, "to": call.payload["email"]})
    if line not in (sent.read_text().splitlines() if sent.exists() else []):
        with sent.open("a") as out:
            out.write(line + "\n")
    return {"mailed": call.payload["email"], "account": call.result_of(account)["account"]}


# Steps are objects: a later step, a result, a run's step are found by them (or by their names).
account = Step("create_account", create, timeout=5, max_failures=3, compensate=delete)
greeting = Step("send_welcome", welcome, timeout=timedelta(seconds=5), max_failures=3)
signup = sas.register(Workflow("signup", [account, greeting]))

if __name__ == "__main__":
    email = sys.argv[1] if len(sys.argv) > 1 else "alice@example.com"
    handle = sas.submit(signup, {"email": email}, business_key=email)
    view = handle.wait(timeout=60)
    print(view.state, view.step(greeting).result)
