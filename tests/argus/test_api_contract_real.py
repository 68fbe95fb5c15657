"""The API keeps its OpenAPI contract: schemathesis, with all its checks, against a real `argus serve` configured as on
a cluster (a Ray head of its own, the session's Prometheus, remediation in dry-run, an admin token). It sends
schema-valid requests (each must be accepted, or refused with a documented status), schema-violating ones (each must
be refused), wrong methods (the Allow header must list the path's methods), requests without a token or with a bad
one, and chains of calls linked by the ids they answer; every answer must be documented and match its schema. A fixed
seed keeps the run reproducible; other seeds are explored by hand (see SEED).

The node agents' routes are served only by an Argus that takes node agents, whose fleet would start agents on the
cluster: they are checked the same way in-process (test_api_contract.py). The Ray this Argus drives is a head of its
own, not the session's cluster: the generated job specs ask for pools and resources no node has, and a job whose
driver can never be placed can be stopped but stays PENDING until Ray's start timeout (15 minutes), so on the
session's cluster they outlived this test and held up the others' clean-ups. Prometheus is the session's."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stage.localstack.argus_cli import argus_env, create_token, serving
from stage.localstack.ray_cluster import RayCluster
from tests.conftest import PrometheusStack

SCHEMATHESIS = [str(Path(sys.executable).with_name("schemathesis"))]
# Another seed or more examples explore further (ARGUS_CONTRACT_SEED=7 ARGUS_CONTRACT_EXAMPLES=100 pytest this file).
SEED = int(os.environ.get("ARGUS_CONTRACT_SEED", "20261129"))
# Examples per operation and phase: every route reaches its documented statuses in well under a minute on two cores;
# the coverage phase adds its own boundary cases (each constraint's edges) whatever this says.
MAX_EXAMPLES = int(os.environ.get("ARGUS_CONTRACT_EXAMPLES", "10"))


@pytest.fixture
def own_ray(tmp_path: Path) -> Iterator[RayCluster]:
    """A Ray head alone, on a loopback address of its own (jobs are submitted to it and never run: no node has the
    `worker` resource a driver asks for)."""
    cluster = RayCluster(tmp_path / "ray", head_ip="127.0.0.9", worker_ips=())
    cluster.start(timeout=180)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.ray
@pytest.mark.prometheus
def test_schemathesis_with_all_checks_finds_no_failure_against_a_configured_argus_serve(
        own_ray: RayCluster, prometheus_stack: PrometheusStack, tmp_path: Path) -> None:
    ray_cluster = own_ray
    shared = tmp_path / "shared"
    shared.mkdir()
    env = argus_env({
        "ARGUS_DATA_DIR": str(tmp_path / "data"), "ARGUS_SHARED_ROOT": str(shared),
        "ARGUS_RAY_DASHBOARD_URL": ray_cluster.dashboard_url, "ARGUS_RAY_GCS_ADDRESS": ray_cluster.gcs_address,
        "ARGUS_PROMETHEUS_URL": prometheus_stack.prometheus.url, "ARGUS_REMEDIATION_MODE": "dry-run",
        "ARGUS_POLL_INTERVAL_S": "5", "ARGUS_REQUEST_TIMEOUT_S": "5"})
    token = create_token(env, "contract", "admin")
    with serving(env, tmp_path / "argus-serve.log") as url:
        run = subprocess.run(
            [*SCHEMATHESIS, "run", f"{url}/openapi.json", "--checks", "all", "--header",
             f"Authorization: Bearer {token}", "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES),
             "--workers", "1", "--request-timeout", "30", "--no-color", "--suppress-health-check", "all"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path)  # its crash cache stays out of the checkout
    assert run.returncode == 0, f"schemathesis found failures:\n{run.stdout[-12_000:]}\n{run.stderr[-2000:]}"
