"""Watching sas_app: the dashboard (Flask, server-rendered), its Prometheus metrics read from the
state store, the formatting both share with the CLI, and the templates."""

from .dashboard import create_dashboard, parse_basic_auth

__all__ = ["create_dashboard", "parse_basic_auth"]
