"""The stage Argus is tested and shown on, apart from the application: the local stack (Ray, Prometheus,
Alertmanager, sshd, llama-server, a webhook receiver), the DCGM exporter simulator and the demo.

Its own distribution (`argus-stage`, stage/pyproject.toml), installed from a source checkout; the `argus-gpu`
wheel does not ship it, and nothing under argus/ imports it except `argus demo`, lazily.
"""
