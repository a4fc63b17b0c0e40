"""Ports: the small interfaces the domain acts through (cluster, dispatch) and the typed errors with
their scope. Adapters implement them; the domain and the services depend only on them.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""
