"""Stage engines: the runner, the per-stage loop, connectors and the orchestrator."""
