"""``python -m sas_app.cli``: the ``sas`` command of this interpreter, on the embedded default app
unless SAS_APP names another."""

import os

from sas_app.cli.base import DEFAULT_APP
from sas_app.cli.main import main

os.environ.setdefault("SAS_APP", DEFAULT_APP)
main()
