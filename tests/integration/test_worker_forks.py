"""The worker forks its pool and its embedded beat before it starts a thread of its own.

A process forked while another thread of the parent is inside an import inherits that module's import
lock, held by a thread it does not have: its own first import of the module blocks for ever. The kick
relay's first connection imports a codec in ``getaddrinfo``; a beat forked at that moment never sent
a sweep again (seen as a workflow a killed worker left behind that nobody resumed), and a pool child
forked so never finished its task. Celery orders steps without stated requirements by hash order, so
the order changed from one run to the next: here it is checked under several hash seeds.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.workerproc import ROOT

ORDER = """
import json
from remediation.workers.celery_app import app
for beat in (True, False):
    w = app.WorkController(pool_cls="prefork", concurrency=1, beat=beat, without_heartbeat=True)
    print(json.dumps([s.name.rsplit(".", 1)[-1] for s in w.blueprint.order]))
"""


def test_the_threads_start_after_the_pool_and_the_beat_have_forked() -> None:
    """The kick relay and the health endpoint each run a thread in the worker's main process."""
    for seed in range(6):
        env = {"PYTHONPATH": str(ROOT), "REMEDIATION_BROKER__REDIS_URL": "redis://127.0.0.1:6379/0",
               "PYTHONHASHSEED": str(seed)}
        out = subprocess.run([sys.executable, "-c", ORDER], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout  # fmt: skip
        for line in out.splitlines():
            order = json.loads(line)
            forks = max(order.index("Pool"), order.index("Beat"))
            assert forks < min(order.index("KickRelayStep"), order.index("HealthStep")), (seed, order)
