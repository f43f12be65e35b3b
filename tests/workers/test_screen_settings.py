"""Where the worker runs the burn-in screen (workers/remediation.py `screen_activities`):
on a real cluster in `[health] screen_dir` (shared storage every node sees), with
`[health] screen_python` and one rank per GPU (`[health] expected_gpus`); in the sandbox in its
state dir, on the fake backend's files, with one rank per node."""

from __future__ import annotations

import sys
from pathlib import Path

from autoclusters.activities.screen import ScreenActivities
from autoclusters.core.settings import Settings
from autoclusters.core.settings_groups import HealthSettings, SandboxSettings
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.workers.remediation import screen_activities


def _screen(settings: Settings) -> ScreenActivities:
    (served,) = screen_activities(settings, SlurmCli(None))
    screen = served.__self__
    assert isinstance(screen, ScreenActivities)
    return screen


def test_a_real_cluster_screens_on_shared_storage_one_rank_per_gpu(tmp_path: Path) -> None:
    health = HealthSettings(
        screen_dir=tmp_path / "shared", screen_python="/opt/train/bin/python", expected_gpus=8
    )
    settings = Settings(health=health)
    screen = _screen(settings)
    assert screen._work_dir == tmp_path / "shared"
    assert (screen._python, screen._ranks, screen._fake_dir) == ("/opt/train/bin/python", 8, None)


def test_the_sandbox_screens_in_its_state_dir_on_the_fake_backend(tmp_path: Path) -> None:
    screen = _screen(
        Settings(
            sandbox=SandboxSettings(state_dir=tmp_path), health=HealthSettings(expected_gpus=8)
        )
    )
    assert screen._work_dir == tmp_path / "screens"
    assert screen._fake_dir == tmp_path / "agent"
    assert (screen._python, screen._ranks) == (sys.executable, None)
