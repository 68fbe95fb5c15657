"""Argus, the application: CLI, daemon, pipeline, store, API and notifications."""

__version__ = "0.1.0"
