"""``python -m remediation.api.serve``: the dashboard, the JSON API and /metrics under uvicorn.

``remediation api`` execs this, as it execs the workers and the watchers, so the CLI imports no entry
point beside it. Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""

from __future__ import annotations

import argparse
import sys

from remediation.adapters import logs
from remediation.settings import SettingsError, load_settings


def main(argv: list[str] | None = None) -> None:
    """Serve on ``--host``/``--port`` (default: ``api.bind``/``api.port``; port 0: any free port, the one
    uvicorn's start-up line names). Bad settings exit 2 with the field's name."""
    import uvicorn

    from remediation.adapters.celery import celery_dispatcher
    from remediation.adapters.queues import queue_depth
    from remediation.api.app import create_app

    parser = argparse.ArgumentParser(prog="remediation api")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logs.configure_from(settings)
    # log_config=None: uvicorn adds no handlers of its own; its loggers reach ours at settings.log_level.
    uvicorn.run(create_app(settings, queue_depth=lambda: queue_depth(settings), dispatcher=celery_dispatcher(settings)),
                host=args.host or settings.api.bind, port=settings.api.port if args.port is None else args.port,
                log_config=None, log_level=settings.log_level.lower(),
                proxy_headers=True, forwarded_allow_ips=settings.api.forwarded_allow_ips)


if __name__ == "__main__":
    main()
