"""Adapters: everything that talks to something outside (Slurm, Kubernetes, the clouds, Redis, Celery,
the webhook), their simulated (``memory``) and dry-run (``noop``) twins, and the one ``factory`` that
picks each backend from settings. Shared by watchers/ and workers/, which never import each other.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""
