"""The pure parts of sandbox/machines/fault_effects.py: each fault kind's realistic effect on a job,
the choice of `--effect`, and the nftables rules that silence a hung node's connections."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoclusters.core.faults import FAULT_PATTERN, NAMED_FAULTS
from autoclusters.sandbox.machines import fault_effects as fe
from autoclusters.sandbox.runtime.config import SandboxConfig


@pytest.mark.parametrize(
    ("fault", "effect"),
    [
        ("XID_79", "hang"),
        ("XID_48", "hang"),
        ("GPU_FELL_OFF_BUS", "hang"),
        ("ECC_DBE", "crash"),
        ("XID_94", "crash"),
        ("XID_95", "crash"),
        ("IB_LINK_DOWN", "lost"),
        ("HCA_FELL_OFF_BUS", "lost"),
        ("THERMAL", "slow"),
        ("ROW_REMAP_PENDING", "none"),
        ("XID_63", "none"),
        ("XID_999", "none"),  # a kind not listed: the agent sees it, the job does not
    ],
)
def test_each_fault_has_its_realistic_effect(fault: str, effect: str) -> None:
    assert fe.default_effect(fault) == effect


def test_every_mapped_fault_is_a_kind_the_project_knows() -> None:
    for fault, effect in fe.DEFAULT_EFFECTS.items():
        assert FAULT_PATTERN.match(fault), fault
        assert fault.startswith("XID_") or fault in NAMED_FAULTS, fault
        assert effect in fe.EFFECTS
    # Every named fault the catalogue knows has a deliberate effect, not the fallback.
    assert NAMED_FAULTS <= fe.DEFAULT_EFFECTS.keys()


def test_effect_option() -> None:
    assert fe.parse_effect(None, "XID_79") == "hang"
    assert fe.parse_effect("default", "ECC_DBE") == "crash"
    assert fe.parse_effect("none", "XID_79") == "none"
    assert fe.parse_effect("lost", "THERMAL") == "lost"
    with pytest.raises(ValueError, match="crash, hang, lost, slow, none"):
        fe.parse_effect("explode", "XID_79")


def test_silence_rules_drop_both_directions_of_each_connection_in_the_nodes_chains() -> None:
    script = fe.render_silence(
        "autoclusters_sb_17200_abcd1234", "gpu-02", [(51000, 29500), (51000, 29500), (29500, 51002)]
    )
    pairs = "{ 29500 . 51000, 29500 . 51002, 51000 . 29500, 51002 . 29500 }"
    assert script == (
        "add table inet autoclusters_sb_17200_abcd1234\n"
        "add chain inet autoclusters_sb_17200_abcd1234 silence_gpu_02_input "
        "{ type filter hook input priority -150; policy accept; }\n"
        f"add rule inet autoclusters_sb_17200_abcd1234 silence_gpu_02_input "
        f"tcp sport . tcp dport {pairs} drop\n"
        "add chain inet autoclusters_sb_17200_abcd1234 silence_gpu_02_output "
        "{ type filter hook output priority -150; policy accept; }\n"
        f"add rule inet autoclusters_sb_17200_abcd1234 silence_gpu_02_output "
        f"tcp sport . tcp dport {pairs} drop\n"
    )
    # A listening socket ((port, 0)): a new connection's SYN to it is dropped.
    assert fe.render_silence("t", "gpu-02", [(29500, 0)]).splitlines()[2] == (
        "add rule inet t silence_gpu_02_input "
        "tcp dport { 29500 } tcp flags & (syn | ack) == syn drop"
    )
    assert fe.render_silence("t", "gpu-02", []) == ""  # no sockets: nothing to silence
    assert fe.render_lift("t", "gpu-02") == (
        "flush chain inet t silence_gpu_02_input\n"
        "delete chain inet t silence_gpu_02_input\n"
        "flush chain inet t silence_gpu_02_output\n"
        "delete chain inet t silence_gpu_02_output\n"
    )


@pytest.mark.skipif(shutil.which("nft") is None, reason="no nft")
def test_nft_accepts_the_rules(tmp_path: Path) -> None:
    table = fe.table_name(SandboxConfig(state_dir=tmp_path))
    script = fe.render_silence(table, "gpu-01", [(40000, 40001), (40002, 0)])
    # --check: parsed and validated by the kernel, applied nowhere.
    done = subprocess.run(["nft", "--check", "-f", "-"], input=script, text=True)
    assert done.returncode == 0


def test_each_sandbox_has_a_table_of_its_own(tmp_path: Path) -> None:
    a = fe.table_name(SandboxConfig(state_dir=tmp_path / "a", port_base=17200))
    b = fe.table_name(SandboxConfig(state_dir=tmp_path / "b", port_base=17200))
    c = fe.table_name(SandboxConfig(state_dir=tmp_path / "a", port_base=17400))
    assert len({a, b, c}) == 3
    assert all(t.startswith("autoclusters_sb_") and t.replace("_", "").isalnum() for t in (a, b))


def test_proc_net_tcp_gives_each_sockets_local_and_remote_port() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n"
        "   0: 0100007F:7331 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0  "
        "      0 1885451 1 0000000000000000 100 0 0 10 0\n"
        "   1: 0100007F:C8D2 0100007F:7331 01 00000000:00000000 00:00000000 00000000     0  "
        "      0 1885999 1 0000000000000000 20 4 30 10 -1\n"
    )
    # The listener's remote port is 0: tcp_connections leaves it out.
    assert fe.parse_proc_net_tcp(text) == [
        ("1885451", 0x7331, 0),
        ("1885999", 0xC8D2, 0x7331),
    ]


def test_slow_duty_cycle_stops_the_rank_part_of_the_time_and_lets_it_run_at_the_end() -> None:
    rank = subprocess.Popen(["sleep", "30"])
    ticks = fe.start_ticks(rank.pid)
    assert ticks is not None
    ticker = subprocess.Popen(
        [sys.executable, "-m", "autoclusters.sandbox.machines.fault_effects", "slow", "3",
         f"{rank.pid}:{ticks}"]
    )  # fmt: skip
    try:
        # The ticker starts (a Python process importing the sandbox: seconds on a loaded
        # machine) before the cycle is sampled: its first stop of the rank, awaited.
        deadline = time.monotonic() + 60
        while fe._state(rank.pid) != "T":  # noqa: SLF001
            assert time.monotonic() < deadline, "the ticker never stopped the rank"
            time.sleep(0.01)
        seen = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            seen.append(fe._state(rank.pid))  # noqa: SLF001
            time.sleep(0.01)
        stopped = seen.count("T") / len(seen)
        assert 0.3 < stopped < 0.95, stopped  # about 2/3 of the time
        ticker.terminate()
        assert ticker.wait(10) == 0
        assert fe._state(rank.pid) == "S"  # noqa: SLF001 - running (asleep) again
    finally:
        ticker.kill()
        rank.kill()
        rank.wait()


def test_power_off_kills_the_stopped_children_before_their_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped child killed after its parent would get SIGHUP and SIGCONT (its process
    group orphaned) and run first: a lost node's srun woke so and killed a step of its
    requeued job's next run."""
    cfg = SandboxConfig(state_dir=tmp_path)
    procs = [fe.Proc(pid=100, ticks=5), fe.Proc(pid=101, ticks=9), fe.Proc(pid=99, ticks=7)]
    fe._save(cfg, "gpu-01", fe.NodeEffect(effect="lost", stopped=procs))  # noqa: SLF001
    alive = {p.pid: p.ticks for p in procs}
    killed: list[int] = []

    def kill(pid: int, sig: int) -> None:
        killed.append(pid)
        alive.pop(pid, None)

    monkeypatch.setattr(fe, "start_ticks", alive.get)
    monkeypatch.setattr(fe.os, "kill", kill)
    fe.power_off(cfg, "gpu-01")
    assert killed == [101, 99, 100]
