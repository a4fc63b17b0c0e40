# One image for every process: worker, beat, watchers, API, migrations (`remediation <command>`).
FROM python:3.11-slim-bookworm AS app
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# scontrol/sinfo and munge for the Slurm watcher and the cli Slurm backend.
RUN apt-get update \
 && apt-get install -y --no-install-recommends slurm-client munge \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY remediation remediation
COPY watchers watchers
COPY workers workers
COPY simulator simulator
COPY migrations migrations
# A plain (non-editable) install: the packages, their data files and the migrations live in
# site-packages, byte-compiled by pip at install time (the root filesystem is read-only in Kubernetes,
# see deploy/base). The sources are removed so nothing can import them instead.
RUN pip install --no-cache-dir . \
 && rm -rf /src \
 && groupadd --gid 10001 remediation \
 && useradd --uid 10001 --gid 10001 --no-create-home remediation
WORKDIR /
USER 10001
ENTRYPOINT ["remediation"]
CMD ["--help"]

# Optional Flower (docker compose --profile flower). It loads our Celery app, so it sees our queues
# under the broker's global key prefix.
FROM app AS flower
USER root
RUN pip install --no-cache-dir flower==2.2.0
USER 10001
ENTRYPOINT ["python", "-m", "celery", "-A", "remediation.workers.celery_app", "flower"]
CMD []

# The default target (`docker build .`, compose's `build: .`) is the application image.
FROM app
