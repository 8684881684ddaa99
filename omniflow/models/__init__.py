"""Models: the registry of stage components and their declared capabilities."""
