"""Local stand-ins that speak the real wire protocols (used by the tests and the demo), and the demo.

The package sits on top of the house: ``demo.run`` (what ``remediation demo`` runs) drives the
real watchers and workers against the simulated cluster, and nothing in remediation/, watchers/ or
workers/ imports the simulator.

Each simulator is a real HTTP server on 127.0.0.1 written with the standard library only, so the
production adapters (the official SDK clients) are exercised unchanged against it. Import the one you
need from its module (``simulator.kube.api``, ...); this package imports none of them eagerly.
"""
