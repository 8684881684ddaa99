"""Moving data to and from the accelerator: staging buffers, uploads, read-backs and bucketed
graph capture."""
