"""Clusters being provisioned, scaled, torn down or rebalanced survive a new worker: every
checked-in ClusterProvisioning, ScaleNodeSet, ClusterTeardown and GpuRebalance history
replays against the current code without nondeterminism.

Record a version's histories before changing the workflows:
`python -m tests.histories.record_cluster vN`, `python -m tests.histories.record_cluster_ops vN`,
`python -m tests.histories.record_share vN`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from autoclusters.workflows.cluster_ops import ClusterTeardown, ScaleNodeSet
from autoclusters.workflows.cluster_provisioning import ClusterProvisioning
from autoclusters.workflows.gpu_rebalance import GpuRebalance

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(
    [
        *HERE.glob("cluster_provisioning_*.json"),
        *HERE.glob("cluster_ops_*.json"),
        *HERE.glob("gpu_rebalance_*.json"),
    ]
)


def test_there_are_histories_to_replay() -> None:
    names = [p.stem for p in HISTORIES]
    assert "cluster_provisioning_v1_ready_with_replacements" in names
    assert "cluster_provisioning_v1_quota_cleanup" in names
    # Behind the cluster-v2-agent-health-gate patch: the gate waits for the agents.
    assert "cluster_provisioning_v2_agent_gate" in names
    for case in ("scale_up_replaced", "scale_down_requeue", "teardown"):
        assert f"cluster_ops_v1_{case}" in names
    for case in ("lend_and_return", "manual_and_rejected"):
        assert f"gpu_rebalance_v1_{case}" in names
        # v2: a move people were asked about says how it ended (MOVE_OUTCOME_NOTICE).
        assert f"gpu_rebalance_v2_{case}" in names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays(path: Path) -> None:
    replayer = Replayer(
        workflows=[ClusterProvisioning, ScaleNodeSet, ClusterTeardown, GpuRebalance],
        data_converter=pydantic_data_converter,
    )
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
