"""Workers: the Celery app, its thin tasks and the adapters that act on Slurm, Kubernetes and clouds."""
