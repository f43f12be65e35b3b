"""A well-formed fault kind that nobody knows is refused, never guessed: the default rule
would otherwise replace a machine for a typo."""

from __future__ import annotations

import subprocess
import sys

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from autoclusters.clients.agent.classify import EXTRA_KINDS, POLICY_KINDS
from autoclusters.clients.api.settings import DEFAULT_ALERT_FAULTS
from autoclusters.core.faults import NAMED_FAULTS, UnknownFaultError, check_known_fault
from autoclusters.core.models import workflow_id
from autoclusters.core.policy import default_policy
from autoclusters.sandbox.config import SandboxConfig

CLI = [sys.executable, "-m", "autoclusters.clients.cli"]


@pytest.mark.parametrize("fault", ["XID_79", "XID_1", "GPU_FELL_OFF_BUS", "IB_LINK_DOWN", "MANUAL"])
def test_known_kinds_pass(fault: str) -> None:
    check_known_fault(fault)


@pytest.mark.parametrize("fault", ["NOT_A_REAL_FAULT", "XID_1234", "GPU_FELL_OF_BUS"])
def test_unknown_kinds_are_refused_with_the_known_list(fault: str) -> None:
    with pytest.raises(UnknownFaultError) as e:
        check_known_fault(fault)
    assert "GPU_FELL_OFF_BUS" in str(e.value) and "XID_<n>" in str(e.value)


def test_a_kind_the_cluster_policy_names_is_known() -> None:
    check_known_fault("SITE_SPECIFIC_FAULT", ["SITE_SPECIFIC_FAULT"])


def test_everything_we_emit_is_in_the_catalogue() -> None:
    """The agent's kinds, the alert map's targets and the shipped policy's names: a fault
    AutoClusters itself produces is never refused."""
    emitted = set(POLICY_KINDS) | set(EXTRA_KINDS)
    emitted |= {f for f in DEFAULT_ALERT_FAULTS.values() if "{" not in f}
    emitted |= {f for f in default_policy().faults if not f.startswith("XID_")}
    assert emitted <= NAMED_FAULTS, emitted - NAMED_FAULTS


@pytest.mark.integration
async def test_the_cli_refuses_an_unknown_fault_and_starts_nothing(
    sandbox: SandboxConfig, sandbox_client: Client, cli_env: dict[str, str]
) -> None:
    node = sandbox.node_names()[-1]
    handle = sandbox_client.get_workflow_handle(workflow_id(sandbox.cluster, node))

    async def run_id() -> str | None:
        try:
            return (await handle.describe()).run_id
        except RPCError:
            return None

    before = await run_id()
    r = subprocess.run(
        [*CLI, "incident", "open", "--node", node, "--fault", "NOT_A_REAL_FAULT"],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r
    assert "unknown fault kind 'NOT_A_REAL_FAULT'" in r.stderr
    assert "GPU_FELL_OFF_BUS" in r.stderr
    assert await run_id() == before
