"""Intents: an action that cannot be taken back, written to its step row before it is sent.

:class:`StepIntents` writes the operation a provider is about to start to the ``provider_op`` of the
step row holding the idempotency key, in a transaction of its own, only if the row has none yet; the
next claim of the step polls it instead of sending again. :meth:`StepIntents.release` takes back the
intent of a request the provider refused. The entry points hand it to the adapter factory.

Why: docs/architecture.md#claim-before-sending-what-has-no-request-id
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from remediation.db.models import DomainRepairStep, RemediationStep
from remediation.ports.errors import ConfigError, TransientError


class StepIntents:
    """Intents kept on ``remediation_steps.provider_op``, found by the step's idempotency key; with
    ``rows=DomainRepairStep``, on a domain repair's steps (the rack's power cycle)."""

    def __init__(self, sessions: Callable[[], Session],
                 rows: type[RemediationStep] | type[DomainRepairStep] = RemediationStep) -> None:
        self.sessions = sessions
        self.rows = rows

    def recorded(self, key: str) -> dict[str, Any] | None:
        """The operation already recorded for ``key``, if any."""
        with self._step(key) as row:
            return dict(row.provider_op) if row.provider_op else None

    def claim(self, key: str, op: dict[str, Any]) -> dict[str, Any] | None:
        """Record ``op`` as the key's operation unless one is there already; None: ``op`` is now the
        key's own (send it), else the operation recorded first (send nothing)."""
        with self._step(key, write=True) as row:
            if row.provider_op:
                return dict(row.provider_op)
            row.provider_op = op
            return None

    def settle(self, key: str, op: dict[str, Any]) -> None:
        """Replace the key's intent with what came of it (the BMC accepted it, what was seen)."""
        with self._step(key, write=True) as row:
            row.provider_op = op

    def release(self, key: str, op: dict[str, Any]) -> None:
        """Take back an intent the BMC refused: nothing was done, a later try may send it."""
        with self._step(key, write=True) as row:
            if row.provider_op == op:
                row.provider_op = None

    def _step(self, key: str, write: bool = False) -> _StepRow:
        return _StepRow(self.sessions, key, write, rows=self.rows)


class _StepRow:
    """The step row of ``key``, locked for update when writing, committed on a clean exit."""

    def __init__(self, sessions: Callable[[], Session], key: str, write: bool, *,
                 rows: type[RemediationStep] | type[DomainRepairStep]) -> None:
        self.sessions, self.key, self.write, self.rows = sessions, key, write, rows
        self.session: Session | None = None

    def __enter__(self) -> RemediationStep | DomainRepairStep:
        try:
            self.session = self.sessions()
            query = select(self.rows).where(self.rows.idempotency_key == self.key)
            row = self.session.scalars(query.with_for_update() if self.write else query).one_or_none()
        except SQLAlchemyError as exc:
            self._close()
            raise TransientError(f"cannot read the step row of a Redfish reset: {exc}") from exc
        if row is None:
            self._close()
            raise ConfigError(
                f"no workflow step holds idempotency key {self.key!r}: a Redfish reset is "
                "sent only for a step whose intent can be recorded",
                component="redfish",
            )
        assert isinstance(row, (RemediationStep, DomainRepairStep))
        return row

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        assert self.session is not None
        try:
            if kind is None and self.write:
                self.session.commit()
        except SQLAlchemyError as error:
            raise TransientError(f"cannot record a Redfish reset on its step row: {error}") from error
        finally:
            self._close()

    def _close(self) -> None:
        if self.session is not None:
            self.session.rollback()
            self.session.close()
            self.session = None
