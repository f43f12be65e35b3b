"""A new machine's agent starts without the memory of the machine it replaces."""

from __future__ import annotations

import sys
from pathlib import Path

from autoclusters.sandbox.machines.backend import forget_old_machine
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable


def _old_memory(cfg: SandboxConfig, node: str) -> Path:
    spool = cfg.agent_spool(node)
    spool.mkdir(parents=True)
    (spool / "state.json").write_text('{"debounce": {"firing": {"XID_79": "old machine"}}}')
    return spool


def test_a_new_machine_forgets_the_old_agent_memory(tmp_path: Path) -> None:
    cfg = SandboxConfig(state_dir=tmp_path)
    spool = _old_memory(cfg, "gpu-01")
    other = _old_memory(cfg, "gpu-02")
    assert forget_old_machine(cfg, "gpu-01")
    assert not spool.exists()
    assert (other / "state.json").exists()  # another node's machine keeps its own


def test_memory_in_use_by_a_running_agent_is_kept(tmp_path: Path) -> None:
    cfg = SandboxConfig(state_dir=tmp_path)
    spool = _old_memory(cfg, "gpu-01")
    table = ProcessTable(cfg.state_dir)
    table.spawn("agent-gpu-01", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not forget_old_machine(cfg, "gpu-01")
        assert (spool / "state.json").exists()
    finally:
        assert table.stop("agent-gpu-01")
