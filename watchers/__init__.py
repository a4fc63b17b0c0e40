"""Watchers: processes that turn slurmctld and the Kubernetes API into NodeEvents on Redis. Adapters
come from ``remediation.adapters``; nothing here imports ``workers``.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""
