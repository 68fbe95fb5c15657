"""The Ray node labels and custom resource by which Argus says where work may run.

Joining a node (control/node_manager.py) writes them onto the node with `ray start --labels/--resources`;
submitting a job (control/jobspec.py, control/jobs.py) asks Ray for them. The two sides used to spell the pool
differently (nodes `argus.io/pool`, jobs `pool`), so a job that named a pool matched no node and waited in
PENDING: both now import the one spelling from here.
"""

from __future__ import annotations

from typing import Final

# Ray's label selector matches node labels by exact key: one spelling for nodes and jobs, under a prefix Argus
# owns so it cannot collide with labels an operator sets by hand.
NODE_LABEL: Final = "argus.io/node"  # the node's name in Argus's registry: how Argus finds its node in Ray
POOL_LABEL: Final = "argus.io/pool"  # the pool a node was joined into; a JobSpec's `pool` selects it
# Every node Argus joins holds one unit of it; a job's driver asks for a sliver, so it lands on a joined worker
# and never on the CPU-only head (Ray runs a driver that asks for nothing on the head).
WORKER_RESOURCE: Final = "worker"
