"""Local stand-ins that speak the real wire protocols (used by the tests and the demo), and the demo.

Each is a real HTTP server on 127.0.0.1 built on the standard library, so the production adapters run
unchanged against it. Nothing in remediation/, watchers/ or workers/ imports this package; import the
stand-in you need from its module (``remediation.simulator.kube.api``, ...).

Why: docs/wire-protocols.md#the-simulated-cluster
"""
