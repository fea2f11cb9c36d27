"""The ``sas`` command (``main``): what every command shares (``base``), the commands that run the
processes (``serve``) and those of an operator (``operate``)."""

from sas_app.cli.main import main

__all__ = ["main"]
