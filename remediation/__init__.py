"""node-remediation's core, in layers (docs/architecture.md): ``cli`` and ``api`` (entry points),
``services``, ``adapters`` and ``db``, ``domain``, ``ports``, and under them ``settings`` and ``clock``."""
