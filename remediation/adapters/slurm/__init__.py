"""Slurm: scontrol argv (``cli``), slurmrestd (``rest``) and pyslurm backends, and Slurm's wire formats
(``parse``, ``diff``). ``backend.make_slurm`` builds the configured real one.

Why: docs/running.md#slurm-releases-and-backends
"""
