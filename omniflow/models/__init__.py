"""Model code: the shapes each preset declares, the interface a runner drives, and each
family's modules and loaders."""
