"""Alembic revision scripts (one module per revision)."""
