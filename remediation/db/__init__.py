"""Storage: models, engine/session set-up and the queries the domain needs."""
