"""The sandbox's own commands refuse a value outside their fixed sets (demo --mode and --job, chaos
--at/--kill, --broken-until, hardware-fault --fixed-by) with Typer's usage error, exit 2,
naming what is allowed, before any sandbox is touched; and their sets are the ones the code
behind them knows."""

from __future__ import annotations

import re
from typing import get_args

import pytest
import typer
from typer.testing import CliRunner

from autoclusters.core.policy import LADDER, Rung
from autoclusters.sandbox import cli as sandbox_cli
from autoclusters.sandbox.drivers import chaos

runner = CliRunner()
app = typer.Typer()
sandbox_cli.register(app)  # as the `autoclusters.cli` entry point does
HOSTILE = "x' OR 1=1"


def _flat(text: str) -> str:
    return re.sub(r"[\s│╭╮╰╯─]+", " ", text)


@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        (["demo", "--mode", HOSTILE], ["observe", "approve", "auto"]),
        (["demo", "--broken-until", HOSTILE], ["reboot", "replace"]),
        (["demo", "--scenario", HOSTILE], ["remediate", "share"]),
        (["demo", "--job", HOSTILE], ["auto", "stand-in"]),
        (["chaos", "--kill", HOSTILE, "--at", "drain"], ["worker", "slurmctld"]),
        (["chaos", "--kill", "worker", "--at", HOSTILE], ["wait_idle", "repair:after-cloud"]),
        (["sandbox", "hardware-fault", "--node", "gpu-01", "--fault", "XID_79",
          "--fixed-by", HOSTILE], ["reset_gpu", "reboot", "replace"]),
    ],
)  # fmt: skip
def test_a_value_outside_the_set_is_refused_with_the_allowed_ones(
    argv: list[str], allowed: list[str], tmp_path: object
) -> None:
    result = runner.invoke(app, [*argv, "--state-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    text = _flat(result.output)
    assert "Invalid value" in text
    for value in allowed:
        assert f"'{value}'" in text, text


def test_the_sets_are_what_the_code_behind_them_knows() -> None:
    assert set(get_args(sandbox_cli.ChaosAt)) == set(chaos.AT_CHOICES)
    assert set(get_args(sandbox_cli.Killable)) == set(chaos.KILLABLE)
    assert set(get_args(sandbox_cli.RepairRung)) == {r.value for r in LADDER if r != Rung.MONITOR}
