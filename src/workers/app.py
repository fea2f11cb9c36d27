"""The example deployment's app: ``celery -A workers.app worker`` / ``beat`` point here.

Settings come from the environment (SAS_BROKER_URL, SAS_DATABASE_URL, …); with none set it runs
on the embedded defaults. A ``celeryconfig.py`` in the folder the process starts in (the
repository's, or the image's /app) adds this deployment's own Celery settings.
"""

from __future__ import annotations

import os

from sas_app import SasApp

from .orders import install

sas = SasApp(celery_config="celeryconfig")
install(
    sas,
    charge_timeout=float(os.environ.get("ORDER_CHARGE_TIMEOUT", "10")),
    max_failures=int(os.environ.get("ORDER_MAX_FAILURES", "3")),
    review_timeout=float(os.environ.get("ORDER_REVIEW_TIMEOUT", "3600")),
)
celery = sas.celery
