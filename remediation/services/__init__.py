"""Application services: the use cases (ingest, the workflow, the levers, the read models...), each one
transaction on a session factory it is given, with follow-up work dispatched only after the commit.

Why: docs/architecture.md#a-step-runs-in-three-phases
"""
