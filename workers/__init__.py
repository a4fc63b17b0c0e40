"""Workers: the Celery app and its thin tasks, and the embedded (in-process) worker. Adapters come from
``remediation.adapters``; nothing here imports ``watchers``.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""
