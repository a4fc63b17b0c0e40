"""Real adapters, one module per system they talk to. Each implements an interface of
remediation.interfaces and translates its SDK's errors into remediation.errors."""
