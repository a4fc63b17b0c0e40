# One image for every process: worker, beat, watchers, API, migrations (`remediation <command>`).
FROM python:3.11-slim-bookworm
# scontrol/sinfo and munge for the Slurm watcher and the cli Slurm backend.
RUN apt-get update \
 && apt-get install -y --no-install-recommends slurm-client munge \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY remediation remediation
COPY watchers watchers
COPY workers workers
COPY simulator simulator
COPY migrations migrations
RUN pip install --no-cache-dir -e . \
 && useradd --uid 10001 --no-create-home remediation
USER 10001
ENTRYPOINT ["remediation"]
CMD ["--help"]
