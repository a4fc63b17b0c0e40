"""node-remediation's core, in layers: ``cli`` and ``api`` (entry points), ``services``, ``adapters`` and
``db``, ``domain``, ``ports``, and under them ``settings`` and ``clock``.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""
