"""Collected evidence: the node's state kept before the hammer (a machine action or a quarantine).

Why: docs/policy.md#collected-evidence-the-nodes-state-before-the-hammer
"""
