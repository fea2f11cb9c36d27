"""An SAS_ALERT_HOOK for tests: appends each alert as a JSON line to $ALERT_FILE."""

from __future__ import annotations

import json
import os

from sas_app import Alert


def record(alert: Alert) -> None:
    with open(os.environ["ALERT_FILE"], "a") as out:
        out.write(json.dumps(alert.as_dict()) + "\n")
