"""Local stand-ins that speak the real wire protocols (used by the tests and the demo).

Each simulator is a real HTTP server on 127.0.0.1 written with the standard library only, so the
production adapters (the official SDK clients) are exercised unchanged against it. Import the one you
need from its module (``simulator.kube_api``, ...); this package imports none of them eagerly.
"""
