"""The running pipeline: one step loop per stage, its thread and inbox, and the orchestrator
that routes requests and frames between stages under flow control."""
