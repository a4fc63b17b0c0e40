"""A worker that dies right after its reset reached the BMC (``python -m`` this, with a JSON argument).

It starts the restart through the real provider, intent and all; the moment the BMC has answered the
POST it prints ``SENT`` and blocks, and the test SIGKILLs it there: after the reset, before the
provider or the workflow could record anything more. Nothing here is a production hook; the wrapper
only marks the moment.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from remediation.adapters.redfish import client
from remediation.adapters.redfish.inventory import Inventory
from remediation.adapters.redfish.provider import RedfishProvider
from remediation.db.intents import StepIntents
from remediation.ports.cluster import VMAction, VMRef
from remediation.settings import RedfishSettings


def main() -> None:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    sent = client.BmcSession.reset

    def reset_then_wait_to_die(self: client.BmcSession, reset_type: str) -> None:
        sent(self, reset_type)
        print("SENT", flush=True)
        sys.stdin.read()  # killed here

    client.BmcSession.reset = reset_then_wait_to_die  # type: ignore[method-assign]
    settings = RedfishSettings(**cfg["settings"])
    intents = StepIntents(sessionmaker(create_engine(cfg["db"], poolclass=NullPool)))
    provider = RedfishProvider(settings, Inventory(settings), intents)
    provider.start(VMRef("redfish", cfg["node"]), VMAction.RESTART, cfg["key"])
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    main()
