"""The domain repair: one ladder for a whole NVLink domain (settings-free rules, then the service)."""
