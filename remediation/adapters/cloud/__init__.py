"""The clouds: GCE, Azure and AWS VM providers, their ``common`` helpers, and the ``router`` that sends
each VM to the cloud its providerID names.

Why: docs/clouds.md#choosing-the-machine-provider
"""
