"""node-remediation: the domain (events, policy, workflow, storage, interfaces, CLI/API)."""
