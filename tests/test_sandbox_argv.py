"""A sandbox start must not fail one time in 64: the Kubernetes emulator's token is
urlsafe base64, which may begin with "-"; passed as a separate argument argparse read it as
the next option ("argument --token: expected one argument"), as a CI run of the outage
matrix showed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

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
        return SimpleNamespace(state=SimpleNamespace(store=None))

    def self_signed(d: Path) -> tuple[Path, Path]:
        (d / "cert.pem").write_text("CERT")
        (d / "key.pem").write_text("KEY")
        return d / "cert.pem", d / "key.pem"

    async def serve(*_: object) -> None:
        seen["served"] = True

    # Everything but the argument parsing (and the kubeconfig it writes) is stubbed out.
    monkeypatch.setattr(k8s_emulator, "create_app", create_app)
    monkeypatch.setattr(k8s_emulator, "self_signed", self_signed)
    monkeypatch.setattr(k8s_emulator, "_bind", lambda host, port: None)
    monkeypatch.setattr(k8s_emulator, "_servers", lambda app, listeners: [])
    monkeypatch.setattr(k8s_emulator, "_serve", serve)
    monkeypatch.setattr(k8s_emulator.uvicorn, "run", lambda *a, **k: None)
    argv = slinky.k8s_emulator_argv(cfg)
    k8s_emulator.main(argv[argv.index("autoclusters.sandbox.k8s_emulator") + 1 :])
    assert seen["token"] == "-Xy_z-token" and seen["served"]
    assert "-Xy_z-token" in cfg.kubectl_kubeconfig.read_text()  # kubectl's, over HTTPS
