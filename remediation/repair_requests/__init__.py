"""Repair requests: hardware quarantined for an RMA handed to the site's repair system (a webhook or a
file), and taken back when the repair is done, through a re-check that returns it or quarantines it again.

Why: docs/policy.md#repair-requests-handing-hardware-to-the-repair-system
"""
