"""detectors.named_node: the node a line names as where a fault happened, read from real Ray texts; hostile text
names nothing or stays bounded."""

from __future__ import annotations

import pytest

from detectors.named_node import NamedNode, node_named_in

NODE = "99417ec8d7b1e36e562b13b943ed85a5055c6e79cd586bb99034beb5"
WORKER = "6a28c3f1e0d9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7"


@pytest.mark.parametrize(("text", "expected"), [
    # the head's gcs_server.out (soak, Ray 2.5x): the worker id comes first and has a node id's shape
    (f"(gcs_server) gcs_worker_manager.cc:70: Reporting worker exit, worker id = {WORKER}, node id = {NODE}, "
     "address = 127.0.0.4, exit_type = NODE_OUT_OF_MEMORY, exit_detail = 1 worker(s) were killed",
     NamedNode(NODE, "127.0.0.4")),
    # the job's exception
    (f"ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory. Memory on the "
     f"node (IP: 127.0.0.4, ID: {NODE}) was 2.99GB used / 23.54GB limit (0.126893)", NamedNode(NODE, "127.0.0.4")),
    # the raylet's summary
    (f"(raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers "
     f"crashed due to other reasons at node (ID: {NODE}, IP: 10.1.2.3) over the last time period.",
     NamedNode(NODE, "10.1.2.3")),
    # the GCS health check: labelled, no address
    (f"Node is dead because the health check failed. node_id={NODE}", NamedNode(NODE)),
    (f"Node ID: {NODE.upper()} node_ip_address=fd00::4 is dead", NamedNode(NODE, "fd00::4")),
])
def test_real_lines_name_the_node(text: str, expected: NamedNode) -> None:
    assert node_named_in(text) == expected


@pytest.mark.parametrize("text", [
    f"Reporting worker exit, worker id = {WORKER}, exit_type = NODE_OUT_OF_MEMORY",  # a worker id is not a node
    f"Worker ID: {WORKER} died",
    f"node id = {NODE[:-1]}",  # 55 digits
    f"node id = {NODE}ab",  # 58 digits
    f"node id = {NODE[:-1]}g",
    "node id = ",
    "",
])
def test_no_labelled_well_formed_node_id_names_nothing(text: str) -> None:
    assert node_named_in(text) is None


def test_a_malformed_address_is_dropped_and_the_node_kept() -> None:
    assert node_named_in(f"Memory on the node (IP: 999.1.1.1, ID: {NODE}) was") == NamedNode(NODE, None)
    assert node_named_in(f"node id = {NODE}, address = not-an-ip, exit_type") == NamedNode(NODE, None)


def test_huge_lines_are_read_only_at_their_start() -> None:
    assert node_named_in(f"node id = {NODE} " + "IP: " * 500_000) == NamedNode(NODE, None)
    assert node_named_in("node id = " * 100_000 + NODE) is None  # past the scanned start: not read
    assert node_named_in("(IP: " + "1." * 200_000) is None
