"""Adapters that ship with the domain: ``noop`` (dry-run) and ``memory`` (the simulated world)."""
