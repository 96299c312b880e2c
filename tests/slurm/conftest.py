"""The real single-node Slurm cluster (tests/slurm/cluster.py), once per test session. Under CI=true a cluster that
cannot start fails the tests that need it; elsewhere they skip with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import IN_CI

from .cluster import DEFAULT_DIR, ClusterError, SlurmCluster
from .sshd import LoginNodeError, login_node


@pytest.fixture(scope="session")
def slurm_cluster():
    cluster = SlurmCluster(DEFAULT_DIR)  # takes over a cluster left in DEFAULT_DIR (`python -m tests.slurm.cluster up`)
    try:
        cluster.start()
    except ClusterError as exc:
        if IN_CI:
            pytest.fail(f"the Slurm test cluster is required under CI=true but did not start: {exc}")
        pytest.skip(f"no Slurm test cluster: {exc}")
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env)
    yield cluster
    if saved is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = saved
    cluster.stop()


@pytest.fixture(scope="session")
def ssh_login(slurm_cluster, tmp_path_factory) -> Path:
    """A real OpenSSH server on a loopback port standing for the cluster's login node (tests/slurm/sshd.py); the
    ssh_config it returns reaches it as host `kernelbot-login`."""
    try:
        with login_node(tmp_path_factory.mktemp("sshd"), slurm_cluster.env) as config:
            yield config
    except LoginNodeError as exc:
        if IN_CI:
            pytest.fail(f"the loopback login node is required under CI=true: {exc}")
        pytest.skip(str(exc))
