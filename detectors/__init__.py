"""Detectors turn Signals into Findings: log rules loaded from YAML, and stateful detectors."""
