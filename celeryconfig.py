"""This deployment's own Celery settings: edit them here.

``src/workers/app.py`` (the deployable: ``sas worker``, ``sas beat``, ``celery -A workers.app``) builds
its Celery app with sas_app's defaults — JSON only, prefetch 1, late acks, the visibility timeout,
the Supervisor's beat schedule (``src/sas_app/messaging/celery_config.py``, all set from ``SAS_*`` variables) —
and then applies every lowercase setting of this module on top, as Celery's ``celeryconfig`` does.
It is read from the folder the process starts in (docker-compose's image copies it to /app); it is
not part of the installed package. Anything left out keeps sas_app's default.

See https://docs.celeryq.dev/en/stable/userguide/configuration.html for the names.
"""

# A worker child that grew past this much memory (KiB) is replaced after its current task.
# worker_max_memory_per_child = 512_000

# Seconds a worker waits for its tasks to finish on a warm shutdown before it gives up.
# worker_soft_shutdown_timeout = 10.0
