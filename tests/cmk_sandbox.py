"""The CMK-platform sandbox that two modules share: the CMK cluster's story
(tests/on_sandbox/test_cmk_on_sandbox.py: provisioned, scaled, deleted and made again from
examples/clusters/cmk.yaml), then `kubectl scale nodeset` on the cluster it made again
(tests/on_sandbox/test_nodeset_scale_out_on_sandbox.py). Each once booted its own, a CMK
boot (the cluster's provisioning, the operator's pods) and its standing by that the second
module did not need: the two run in one xdist group, in that order, on one sandbox, booted
at the first of them and stopped after the last (tests/worker_sandbox.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoclusters.core.cluster_spec import load_cluster_spec
from autoclusters.sandbox.runtime.config import SandboxConfig
from tests.helpers import down_leaving_nothing
from tests.worker_sandbox import WorkerSandbox

FIXTURE = "cmk_sandbox"
# Both modules' tests in one worker, the CMK story's first (collection order).
GROUP = pytest.mark.xdist_group("cmk-sandbox")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "cmk.yaml"


def cmk_sandboxes(state_dir: Path, port_base: int) -> WorkerSandbox:
    """The worker's CMK sandbox, named as the example spec (so `cluster create -f
    examples/clusters/cmk.yaml` makes its cluster again), in `state_dir` at `port_base`."""
    spec, _ = load_cluster_spec(EXAMPLE)
    cfg = SandboxConfig(
        state_dir=state_dir, cluster=spec.name, platform="cmk",
        nodes=spec.node_sets[0].count, port_base=port_base, boot_delay_s=1,
        breaker_threshold=100, accounting=True,
        # No test of either module sends inference load.
        inference=False,
    )  # fmt: skip
    # Nor anything the table never knew of (a slurmd whose record was lost once).
    return WorkerSandbox(FIXTURE, cfg, down=down_leaving_nothing)
