"""Watchers: processes that turn slurmctld and the Kubernetes API into NodeEvents on Redis."""
