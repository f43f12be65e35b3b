"""docker-compose.yml cannot run here (no Docker engine), so check what it promises:
its services, images, ports, and that the commands it runs exist in the project."""

from __future__ import annotations

from pathlib import Path

import yaml

from autoclusters.clients.cli import app
from autoclusters.integrations.temporal import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parent.parent


def _compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_runs_temporal_with_our_search_attributes() -> None:
    temporal = _compose()["services"]["temporal"]
    assert temporal["image"].startswith("temporalio/temporal:")
    assert {"7233:7233", "8233:8233"} <= {p.split(" ")[0] for p in temporal["ports"]}
    declared = {
        a.split("=", 1)[1] for a in temporal["command"] if a.startswith("--search-attribute=")
    }
    assert declared == {f"{k.name}=Keyword" for k in SEARCH_ATTRIBUTES}


def test_compose_worker_runs_a_real_cli_command_from_a_buildable_image() -> None:
    worker = _compose()["services"]["worker"]
    commands = {c.name or c.callback.__name__ for c in app.registered_commands}  # type: ignore[union-attr]
    assert worker["command"][0] in commands
    assert worker["depends_on"]["temporal"]["condition"] == "service_healthy"
    dockerfile = (ROOT / worker["build"] / "Dockerfile").read_text()
    copied = set()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
                copied.add(src)
    # Every layer linked into the import root is in the image, except the sandbox.
    layers = {p.name for p in (ROOT / "autoclusters").iterdir() if p.is_symlink()}
    assert layers - copied == {"sandbox"}
    env = worker["environment"]
    assert env["AUTOCLUSTERS_TEMPORAL_ADDRESS"] == "temporal:7233"


def test_compose_config_mount_holds_a_valid_policy() -> None:
    from autoclusters.core.policy import load_policy

    worker = _compose()["services"]["worker"]
    mount = next(v for v in worker["volumes"] if v.endswith(":/etc/autoclusters:ro"))
    host_dir = ROOT / mount.split(":")[0]
    policy_path = worker["environment"]["AUTOCLUSTERS_POLICY_FILE"]
    assert policy_path.startswith("/etc/autoclusters/")
    load_policy(host_dir / policy_path.removeprefix("/etc/autoclusters/"))
