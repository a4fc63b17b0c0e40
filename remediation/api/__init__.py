"""The on-call web API and dashboard: ``create_app(settings, sessions, queue_depth, clock, dispatcher)``."""

from remediation.api.app import create_app

__all__ = ["create_app"]
