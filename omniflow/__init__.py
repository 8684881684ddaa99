"""omniflow: a serving framework for multi-stage speech models, driven by typed configuration."""

__version__ = "0.1.0"
