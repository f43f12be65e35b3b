"""Settings read the default sandbox's file only while that sandbox runs, and no test ever
reads a user's ~/.autoclusters (conftest isolates HOME and AUTOCLUSTERS_*)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoclusters.core import settings
from autoclusters.core.process_start import start_ticks
from autoclusters.core.settings import Settings, config_file, default_sandbox_dir

LEFTOVER_TOML = 'cluster = "leftover"\n[kubernetes]\nkubeconfig = "/leftover/kubeconfig"\n'


def _own_start_ticks() -> int:
    ticks = start_ticks(os.getpid())
    assert ticks is not None  # this process runs
    return ticks


def _default_sandbox(pid: int | None, ticks: int | None = None) -> Path:
    """A default sandbox's files as `sandbox up` leaves them: the toml, the record, and the
    Temporal server's PID record (none: never started, or `sandbox down` removed it)."""
    state = default_sandbox_dir()
    (state / "pids").mkdir(parents=True)
    (state / "autoclusters.toml").write_text(LEFTOVER_TOML)
    (state / "autoclusters.sandbox.json").write_text(json.dumps({"state_dir": str(state)}))
    if pid is not None:
        record = {"name": "temporal", "pid": pid, "start_ticks": ticks, "argv": [], "log": ""}
        (state / "pids" / "temporal.json").write_text(json.dumps(record))
    return state


def test_home_and_environment_are_isolated(_hermetic: Path) -> None:
    assert Path.home() == _hermetic
    assert default_sandbox_dir() == _hermetic / ".autoclusters" / "sandbox"
    assert not [k for k in os.environ if k.startswith("AUTOCLUSTERS_")]
    assert config_file() is None


def test_stopped_sandbox_leftover_toml_is_not_read() -> None:
    # What `make demo` leaves: the toml and the record, the PID records of dead processes.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _default_sandbox(dead.pid, 12345)
    assert config_file() is None
    s = Settings()
    assert s.cluster == "sandbox" and s.kubernetes.kubeconfig is None


def test_stopped_sandbox_without_pid_records_is_not_read() -> None:
    _default_sandbox(None)
    assert config_file() is None
    assert Settings().cluster == "sandbox"


def test_reused_pid_is_not_a_running_sandbox() -> None:
    # Our own PID, alive, but not the process the sandbox recorded (other start time).
    _default_sandbox(os.getpid(), _own_start_ticks() + 1)
    assert config_file() is None


def test_running_sandbox_toml_is_read() -> None:
    state = _default_sandbox(os.getpid(), _own_start_ticks())
    assert settings.sandbox_running(state)
    assert config_file() == state / "autoclusters.toml"
    s = Settings()
    assert s.cluster == "leftover"
    assert s.kubernetes.kubeconfig == Path("/leftover/kubeconfig")


def test_explicit_config_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _default_sandbox(os.getpid(), _own_start_ticks())
    mine = tmp_path / "mine.toml"
    mine.write_text('cluster = "mine"\n')
    monkeypatch.setenv("AUTOCLUSTERS_CONFIG", str(mine))
    assert Settings().cluster == "mine"
