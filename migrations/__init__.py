"""Alembic migrations, shipped in the wheel as their own package.

``remediation db upgrade`` finds them as the package resource ``migrations:`` (Alembic's
``script_location``), so a plain ``pip install .`` (not only an editable install) migrates a database.

Why: docs/running.md#schema-migrations
"""
