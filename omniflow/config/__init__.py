"""Configuration: Hydra composition, pydantic schema, build-time rules."""
