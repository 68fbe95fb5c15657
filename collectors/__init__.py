"""Collectors observe the outside world (Ray state, DCGM exporters, Prometheus, logs) and emit Signals."""
