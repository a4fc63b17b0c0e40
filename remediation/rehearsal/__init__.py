"""The policy rehearsal behind ``remediation rehearse``: replay a fault trace against the policy and
compare what it would cost.

The rehearsal is a tool *about* the service, not part of it, so it sits above the services (it drives
the real ``ingest`` and ``Workflow``) and below the CLI, and no production module imports it (both are
import-linter contracts in ``pyproject.toml``). Its modules:

- :mod:`~remediation.rehearsal.trace`: fault traces, read from events or synthesised from a failure mix;
- :mod:`~remediation.rehearsal.truth`: the outcome model, what really fixes each kind of fault;
- :mod:`~remediation.rehearsal.world`: what a fault and a repair by hand do to the simulated world;
- :mod:`~remediation.rehearsal.loop`: the discrete-event loop on a simulated clock;
- :mod:`~remediation.rehearsal.run`: one rehearsal, stage set up and torn down (:func:`rehearse`);
- :mod:`~remediation.rehearsal.report`: what it reports, judged by the world;
- :mod:`~remediation.rehearsal.compare`: two policies on one trace, side by side.
"""
