"""Kubernetes: the adapter (cordon, taint, evict, read), the Slurm-node-to-Node ``mapping`` and the
``client`` configuration with its error translation.

Why: docs/kubernetes.md#how-the-adapter-acts-on-nodes
"""
