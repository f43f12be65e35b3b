"""scripts/python.sh: the interpreter `make` builds the venv from is one that can (3.11 or
newer, with venv's pip), the distribution's where it can, else `python3` on PATH."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "python.sh"


def _choice(path: str) -> str:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        ["/bin/sh", str(SCRIPT)], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


SYSTEM = Path("/usr/bin/python3")
# What building the venv needs of the interpreter: 3.11 or newer, and venv's pip.
CAN_MAKE_THE_VENV = "import sys, ensurepip; assert sys.version_info >= (3, 11); ensurepip.version()"


def test_the_system_interpreter_is_chosen_exactly_when_it_can_make_the_venv() -> None:
    # A bound for a hang, not a speed: an interpreter's start and one import.
    can = (
        SYSTEM.exists()
        and subprocess.run(
            [str(SYSTEM), "-c", CAN_MAKE_THE_VENV], capture_output=True, timeout=30
        ).returncode
        == 0
    )
    assert _choice(os.environ["PATH"]) == (str(SYSTEM) if can else "python3")


def test_the_choice_does_not_depend_on_path_when_the_system_one_can() -> None:
    # The system interpreter is found by its path, not by PATH (a pyenv shim first on PATH
    # must not win), and where it cannot make a venv the answer is plain python3.
    assert _choice("/nonexistent") == _choice(os.environ["PATH"])
