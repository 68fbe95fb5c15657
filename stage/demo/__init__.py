"""`argus demo`: the whole loop on one machine (see stage/demo/run.py)."""

from stage.demo.run import run_demo

__all__ = ["run_demo"]
