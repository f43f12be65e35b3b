"""The agent's command line: its Typer app run in this process (Typer's CliRunner: the
same commands, exit codes and stdout/stderr as `python -m autoclusters.clients.cli.agent`,
without an interpreter and the project's imports per call), and as a real process once
each through `python -m` and deploy/agent/nvml-check.sh:

- `agent run --backend nvml` on a machine without the NVIDIA driver says so in one line
  and exits 2, never with a traceback (also through deploy/agent/nvml-check.sh);
- `inject` writes the fake file that the fake backend reads: the Xid arrives as an event,
  `agent run --once --print` reports it (exit 1) and a cleared node reports nothing (exit 0);
- `inject` refuses fault kinds the agent cannot see on a node; `run` needs --api or --print;
- `--show-readings` prints the readings;
- injections are atomic and serialised: a reader never sees half a file, no write is lost.
"""

from __future__ import annotations

import ctypes.util
import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoclusters.clients.agent import fake_backend
from autoclusters.clients.agent.fake_backend import FakeBackend, read_node
from autoclusters.clients.cli.agent import cli as agent_cli
from autoclusters.core.node_report import NodeReport

ROOT = Path(__file__).resolve().parents[2]
NO_DRIVER = "NVML unavailable: driver not loaded (libnvidia-ml.so.1 not found)"
needs_no_driver = pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML"
)


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AUTOCLUSTERS_")}


def cli_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The agent's command line as a GPU machine runs it: `python -m` in a process."""
    return subprocess.run(
        [sys.executable, "-m", "autoclusters.clients.cli.agent", *args],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str) -> Ran:
    """The agent's command line in this process: the app `python -m` runs, its exit code
    and its stdout and stderr apart. An exception the app does not turn into an exit fails
    here (a process would have printed a traceback). The root logger is left as it was:
    `agent run` configures logging as a process would."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        r = CliRunner().invoke(agent_cli, list(args), catch_exceptions=False)
    finally:
        root.handlers[:], root.level = handlers, level
    return Ran(r.exit_code, r.stdout, r.stderr)


@needs_no_driver
@pytest.mark.parametrize(
    "extra", [["--once", "--print"], ["--api", "http://127.0.0.1:9", "--interval", "1"]]
)
def test_nvml_without_a_driver_says_so_in_one_line(tmp_path: Path, extra: list[str]) -> None:
    p = cli("agent", "run", "--node", "gpu-01", "--backend", "nvml",
            "--spool-dir", str(tmp_path), *extra)  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip() == NO_DRIVER
    assert p.stdout == ""


@needs_no_driver
def test_the_module_runs_on_its_own_and_says_so_in_one_line(tmp_path: Path) -> None:
    """`python -m autoclusters.clients.cli.agent` in a process of its own, as on a GPU machine
    without the full CLI set-up: one line and exit 2, no traceback."""
    p = cli_process("agent", "run", "--node", "gpu-01", "--backend", "nvml",
                    "--spool-dir", str(tmp_path), "--once", "--print")  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip() == NO_DRIVER
    assert p.stdout == ""


@needs_no_driver
def test_nvml_check_script_runs_and_fails_clearly_here() -> None:
    script = ROOT / "deploy" / "agent" / "nvml-check.sh"
    assert os.access(script, os.X_OK)
    subprocess.run(["bash", "-n", str(script)], check=True)
    p = subprocess.run(
        [str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=env() | {"PYTHON": sys.executable},
    )  # fmt: skip
    assert p.returncode == 2, p.stdout + p.stderr
    assert NO_DRIVER in p.stderr and "Traceback" not in p.stderr


def test_inject_writes_what_the_fake_backend_reads(tmp_path: Path) -> None:
    fake = tmp_path / "gpu-02.json"
    p = cli(
        "inject", "--node", "gpu-02", "--fault", "XID_79", "--gpu", "5", "--fake-file", str(fake)
    )
    assert p.returncode == 0, p.stderr
    assert "XID_79" in p.stdout
    node = read_node(fake)
    assert [(e.kind, e.code, e.gpu, e.uuid) for e in node.events] == [
        ("xid", 79, 5, "GPU-fake-0005")
    ]
    backend = FakeBackend(fake)
    backend.open()
    assert backend.read().device_count == 8
    assert [e.code for e in backend.events()] == [79]
    assert backend.events() == []  # each event once

    p = cli("agent", "run", "--node", "gpu-02", "--backend", "fake", "--fake-file", str(fake),
            "--once", "--print")  # fmt: skip
    assert p.returncode == 1, p.stderr
    (line,) = p.stdout.splitlines()
    r = NodeReport.model_validate_json(line)
    assert (r.node, r.fault, r.state) == ("gpu-02", "XID_79", "firing")

    assert cli("inject", "--node", "gpu-02", "--clear", "--fake-file", str(fake)).returncode == 0
    p = cli("agent", "run", "--node", "gpu-02", "--backend", "fake", "--fake-file", str(fake),
            "--once", "--print")  # fmt: skip
    assert (p.returncode, p.stdout) == (0, "")


def test_inject_ib_faults_land_in_the_fake_infiniband(tmp_path: Path) -> None:
    fake = tmp_path / "n.json"
    assert cli("inject", "--node", "n", "--fault", "IB_LINK_DOWN", "--hca", "mlx5_3",
               "--fake-file", str(fake)).returncode == 0  # fmt: skip
    ib = read_node(fake).infiniband
    assert ib is not None
    (p,) = [p for p in ib.ports if p.hca == "mlx5_3"]
    assert (p.state, p.phys_state) == ("1: DOWN", "3: Disabled")


def test_inject_refuses_what_the_agent_cannot_see(tmp_path: Path) -> None:
    for fault in ("NODE_NOT_READY", "MANUAL"):
        p = cli("inject", "--node", "n", "--fault", fault, "--fake-file", str(tmp_path / "f"))
        assert p.returncode == 2 and "cannot inject" in p.stderr
    # A kind nobody knows: one line that points at the catalogue.
    p = cli("inject", "--node", "n", "--fault", "xid79", "--fake-file", str(tmp_path / "f"))
    assert p.returncode == 2
    assert p.stderr == "unknown fault kind 'xid79': see 'autoclusters faults' for the kinds known\n"
    assert not (tmp_path / "f").exists()


def test_run_needs_somewhere_to_send(tmp_path: Path) -> None:
    p = cli("agent", "run", "--node", "n", "--backend", "fake", "--fake-file", str(tmp_path / "f"))
    assert p.returncode == 2 and "--api" in p.stderr


def test_show_readings_prints_them(tmp_path: Path) -> None:
    fake = tmp_path / "n.json"
    p = cli("agent", "run", "--node", "n", "--backend", "fake", "--fake-file", str(fake),
            "--once", "--print", "--show-readings")  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)["readings"]
    assert doc["gpus"]["device_count"] == 8 and len(doc["infiniband"]["hcas"]) == 8
    assert doc["findings"] == {} and doc["firing"] == {}


def test_injections_are_atomic_and_none_is_lost(tmp_path: Path) -> None:
    fake = tmp_path / "n.json"
    fake_backend.reset(fake)
    stop = threading.Event()
    seen: list[int] = []
    problems: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(len(read_node(fake).events))
            except BaseException as e:  # a torn read would fail to parse
                problems.append(e)

    def writer() -> None:
        for _ in range(25):
            fake_backend.inject(fake, fault="XID_13")

    r = threading.Thread(target=reader)
    r.start()
    writers = [threading.Thread(target=writer) for _ in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    r.join()
    assert problems == []
    node = read_node(fake)
    assert len(node.events) == 100 and sorted(e.seq for e in node.events) == list(range(1, 101))
    assert seen == sorted(seen)  # the reader only ever saw whole, growing files
