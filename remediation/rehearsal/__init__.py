"""The policy rehearsal behind ``remediation rehearse``: replay a fault trace against the policy and
compare what it would cost.

Modules: ``trace`` (read or synthesise fault traces), ``truth`` (the outcome model), ``world`` (what
faults and repairs by hand do), ``loop`` (the discrete-event loop), ``run`` (one rehearsal,
:func:`rehearse`), ``report`` (its figures) and ``compare`` (two policies side by side). It sits above
the services and below the CLI; no production module imports it.

Why: docs/rehearsal.md#how-the-rehearsal-is-built
"""
