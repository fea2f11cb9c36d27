"""Watching sas_app: the dashboard (``web.dashboard``, Flask, server-rendered), its Prometheus
metrics read from the state store (``web.metrics``), the run timeline and chart (``web.timeline``),
the formatting they share with the CLI (``web.formatting``), and the templates.

Nothing is imported here, so the CLI's workers, which use only the formatting, never load Flask.
"""
