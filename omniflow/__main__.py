"""`python -m omniflow {serve,synth,config,bench,sweep} [overrides]`."""

from omniflow.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
