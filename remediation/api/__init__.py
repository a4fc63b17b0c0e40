"""The on-call web API and dashboard. ``create_app(settings, sessions=None, queue_depth=None)``."""

from remediation.api.app import create_app

__all__ = ["create_app"]
