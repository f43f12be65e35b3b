"""The matrices' sandboxes: the outage matrix, the chaos matrix (and after them the restart
tests) run their cases on the same Slurm-on-Kubernetes sandboxes (Crusoe emulator included),
MATRIX_SANDBOXES of them side by side, one per xdist group (`matrix_group`). They need the
same world: four nodes, 2 s boots, no breaker, every case a first incident on its node; a
boot costs ~16 s of CPU and a sandbox standing by ~0.08 of a core, so one set of sandboxes
for all three instead of six. Each worker's is booted at its first matrix case and stopped
after its last (tests/worker_sandbox.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoclusters.sandbox.drivers.outage_matrix import every_case_a_first_incident
from autoclusters.sandbox.runtime.config import SandboxConfig
from tests.worker_sandbox import WorkerSandbox

FIXTURE = "matrix_sandbox"
MATRIX_SANDBOXES = 3


def matrix_group(i: int) -> pytest.MarkDecorator:
    """The xdist group of a matrix's i-th case: the cases dealt over the sandboxes in turn."""
    return pytest.mark.xdist_group(f"matrix-{i % MATRIX_SANDBOXES}")


def matrix_sandboxes(state_dir: Path, port_base: int) -> WorkerSandbox:
    """A worker's matrix sandbox, in `state_dir` at `port_base`."""
    cfg = SandboxConfig(
        state_dir=state_dir, cluster="matrix", nodes=4, port_base=port_base,
        boot_delay_s=2, k8s=True, breaker_threshold=100,
        # No case sends inference load: no kubelet and gateway standing by for seven minutes.
        inference=False,
    )  # fmt: skip
    return WorkerSandbox(FIXTURE, cfg, prepare=every_case_a_first_incident)
