"""The sandbox's API credentials, one per role as in production (clients/web/tokens.py):
the agents', Alertmanager's, a reader's (Prometheus), and one operator token per approver
(alice, bob), each a person's own file under `api/operators/`, kept in the API's settings
as its SHA-256 only. The key that signs decisions (`[approval] keys`) reaches the API and
the worker in their environment, never the settings file a CLI reads."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Any, Protocol


class SandboxConfig(Protocol):
    """What of the sandbox's config this needs (config.py writes the grants into the
    settings file, so this module does not import it back)."""

    @property
    def state_dir(self) -> Path: ...
    @property
    def approvers(self) -> list[str]: ...


AGENT, ALERTMANAGER, READER = "token", "alertmanager-token", "reader-token"
APPROVAL_KEY = "approval-key"


def _dir(cfg: SandboxConfig) -> Path:
    return cfg.state_dir / "api"


def operator_file(cfg: SandboxConfig, person: str) -> Path:
    """The person's own operator token (AUTOCLUSTERS_API_TOKEN for `autoclusters approve`)."""
    return _dir(cfg) / "operators" / person


def _make(path: Path, value: str) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value)
    os.chmod(path, 0o600)


def make(cfg: SandboxConfig) -> None:
    """Every credential the sandbox's API knows; kept across restarts of the sandbox."""
    for name in (AGENT, ALERTMANAGER, READER):
        _make(_dir(cfg) / name, secrets.token_urlsafe(24))
    _make(_dir(cfg) / APPROVAL_KEY, secrets.token_urlsafe(48))
    for person in cfg.approvers:
        _make(operator_file(cfg, person), secrets.token_urlsafe(24))


def read(cfg: SandboxConfig, name: str) -> str:
    return (_dir(cfg) / name).read_text().strip()


def grants(cfg: SandboxConfig) -> dict[str, Any]:
    """`api_tokens` for the settings file: the services' tokens under their role's name, the
    approvers' as hashes (the API never holds a person's token)."""
    out: dict[str, Any] = {
        "agent": read(cfg, AGENT),
        "alertmanager": read(cfg, ALERTMANAGER),
        "reader": read(cfg, READER),
    }
    for person in cfg.approvers:
        token = operator_file(cfg, person).read_text().strip()
        out[person] = {"role": "operator", "sha256": hashlib.sha256(token.encode()).hexdigest()}
    return out


def approval_env(cfg: SandboxConfig) -> dict[str, str]:
    """The API's and the worker's approval key."""
    return {"AUTOCLUSTERS_APPROVAL__KEYS": f'["{read(cfg, APPROVAL_KEY)}"]'}
