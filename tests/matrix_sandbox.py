"""The matrices' sandboxes: the outage matrix and the chaos matrix run their cases on the same
Slurm-on-Kubernetes sandboxes (Crusoe emulator included), MATRIX_SANDBOXES of them side by
side, one per xdist group (`matrix_group`). Both matrices need the same world: four nodes,
2 s boots, no breaker, every case a first incident on its node; a boot costs ~16 s of CPU and
a sandbox standing by ~0.08 of a core, so one set of sandboxes for both instead of five.

Each xdist worker boots its matrix sandbox at its first matrix case and stops it (by its
recorded PIDs) as soon as its next test is not a matrix case (`stop_after`), not at the end
of the session: the rest of the run would otherwise pay for a sandbox standing by.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoclusters.sandbox import cluster
from autoclusters.sandbox.config import SandboxConfig
from autoclusters.sandbox.outage_matrix import every_case_a_first_incident

FIXTURE = "matrix_sandbox"
MATRIX_SANDBOXES = 3

_running: dict[str, SandboxConfig] = {}


def matrix_group(i: int) -> pytest.MarkDecorator:
    """The xdist group of a matrix's i-th case: the cases dealt over the sandboxes in turn."""
    return pytest.mark.xdist_group(f"matrix-{i % MATRIX_SANDBOXES}")


def running() -> SandboxConfig | None:
    """This worker's matrix sandbox, if it is up."""
    return _running.get("cfg")


def boot(state_dir: Path, port_base: int) -> SandboxConfig:
    """Boot this worker's matrix sandbox (at its first matrix case)."""
    if "cfg" in _running:
        raise RuntimeError(f"a matrix sandbox is already up in {_running['cfg'].state_dir}")
    cfg = SandboxConfig(
        state_dir=state_dir, cluster="matrix", nodes=4, port_base=port_base,
        boot_delay_s=2, k8s=True, breaker_threshold=100,
    )  # fmt: skip
    cluster.up(cfg)
    every_case_a_first_incident(cfg)
    _running["cfg"] = cfg
    return cfg


def stop_after(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a matrix case whose next test (in this worker) is not one: down, by PID."""
    if FIXTURE not in getattr(item, "fixturenames", ()):
        return
    if nextitem is not None and FIXTURE in getattr(nextitem, "fixturenames", ()):
        return
    stop()


def stop() -> None:
    cfg = _running.pop("cfg", None)
    if cfg is not None:
        cluster.down(cfg)
