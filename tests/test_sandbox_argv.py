"""A sandbox start must not fail one time in 64: the Kubernetes emulator's token is
urlsafe base64, which may begin with "-"; passed as a separate argument argparse read it as
the next option ("argument --token: expected one argument"), as a CI run of the outage
matrix showed."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoclusters.sandbox import k8s_emulator, slinky
from autoclusters.sandbox.config import SandboxConfig


def test_a_token_that_begins_with_a_dash_reaches_the_emulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = SandboxConfig(state_dir=tmp_path, cluster="c", nodes=2, port_base=20000)
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "token").write_text("-Xy_z-token\n")
    seen: dict[str, object] = {}

    def create_app(token: str, **_: object) -> object:
        seen["token"] = token
        return object()

    monkeypatch.setattr(k8s_emulator, "create_app", create_app)
    monkeypatch.setattr(k8s_emulator.uvicorn, "run", lambda *a, **k: None)
    argv = slinky.k8s_emulator_argv(cfg)
    k8s_emulator.main(argv[argv.index("autoclusters.sandbox.k8s_emulator") + 1 :])
    assert seen["token"] == "-Xy_z-token"
