"""``memory``: the in-memory world behind the ``memory`` backends (``REMEDIATION_MEMORY__*``).

This section was called ``sim``; the loader still reads ``sim:`` in a config file and
``REMEDIATION_SIM__*`` in the environment as this section (``RENAMED_SECTIONS`` in
:mod:`remediation.settings.loader`), so a site's old configuration keeps working.
"""

from __future__ import annotations

from pydantic import Field

from remediation.settings.base import Section


class MemoryWorldSettings(Section):
    """The simulated world behind the ``memory`` backends (embedded default, demo, tests)."""

    nodes: str = Field("gpu-node-[0-15]", description="Hostlist of simulated nodes.")
    journal: str | None = Field(
        None,
        description="JSON file holding the simulated world, shared by every worker process; unset = "
        "in-process memory only.",
    )
    op_polls: int = Field(1, ge=1, description="Polls before a simulated VM operation completes.")
    call_delay_s: dict[str, float] = Field(
        default_factory=dict,
        description="Seconds a simulated call sleeps after acting (e.g. {'vm.start': 5}); for crash tests.",
    )
