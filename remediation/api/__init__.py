"""The on-call web API and dashboard: ``create_app(settings, sessions, queue_depth, *, clock, dispatcher)``.

``create_app`` is imported on first use, not with the package: the CLI reads the reliability report's
module from here, and importing FastAPI would add seconds to every command that serves no page.

Why: docs/running.md#the-api-and-the-dashboard
"""

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from remediation.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
