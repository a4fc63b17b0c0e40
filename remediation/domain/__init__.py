"""The domain: pure rules and value types (events, policy, flap filter, attribution, the state machine
and the step bodies). No database, no broker, no SDK, not even through another module.

Why: docs/architecture.md#the-house-layers-imports-pointing-down
"""
