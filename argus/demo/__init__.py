"""`argus demo`: the whole loop on one machine (see argus/demo/run.py)."""

from argus.demo.run import run_demo

__all__ = ["run_demo"]
