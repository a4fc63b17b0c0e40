"""Alembic revision scripts (one module per revision).

Why: docs/running.md#schema-migrations
"""
