"""scripts/python.sh: the interpreter `make` builds the venv from is one that can (3.11 or
newer, with venv's pip), the distribution's where it can, else `python3` on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "python.sh"


def _choice(path: str) -> str:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        ["/bin/sh", str(SCRIPT)], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_choice_can_make_the_venv() -> None:
    chosen = _choice(os.environ["PATH"])
    exe = chosen if "/" in chosen else shutil.which(chosen)
    assert exe is not None, chosen
    check = "import sys, ensurepip; assert sys.version_info >= (3, 11); ensurepip.version()"
    if chosen == "/usr/bin/python3":
        subprocess.run([exe, "-c", check], check=True, timeout=30)
    else:  # the fallback: the python3 on PATH, whatever it is (make's old default)
        assert chosen == "python3"


def test_the_choice_does_not_depend_on_path_when_the_system_one_can() -> None:
    # The system interpreter is found by its path, not by PATH (a pyenv shim first on PATH
    # must not win), and where it cannot make a venv the answer is plain python3.
    assert _choice("/nonexistent") == _choice(os.environ["PATH"])
