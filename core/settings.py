"""Settings for every entry point: environment (AUTOCLUSTERS_*) over a TOML file over defaults.

Grouped per concern: a group is a TOML table and an environment prefix with a double
underscore (`[temporal] address` is AUTOCLUSTERS_TEMPORAL__ADDRESS); the environment
overrides one key of a table and keeps the file's others.

The file is named by AUTOCLUSTERS_CONFIG; without it, the default sandbox's file is used
while that sandbox is running, so `autoclusters incident open ...` just works after
`autoclusters sandbox up`, and a stopped sandbox's leftover file (its kubeconfig, its API
tokens) is never read.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from autoclusters.core.policy import Policy, default_policy, load_policy
from autoclusters.core.process_start import start_ticks
from autoclusters.core.settings_groups import (
    ApprovalSettings,
    ConsoleSettings,
    CrusoeSettings,
    HandoffSettings,
    HealthSettings,
    KubernetesSettings,
    MonitoringSettings,
    RemediationSettings,
    SandboxSettings,
    SlurmSettings,
    TemporalSettings,
    WorkerSettings,
)
from autoclusters.core.settings_renames import renamed_in
from autoclusters.core.slack_config import SlackConfig

DEFAULT_SANDBOX_DIR = Path.home() / ".autoclusters" / "sandbox"
CONFIG_FILE_NAME = "autoclusters.toml"
# What `sandbox up` writes into its state dir (sandbox/runtime/config.py,
# sandbox/runtime/processes.py): the sandbox's record, and one JSON record per process under pids/.
SANDBOX_RECORD_NAME = "autoclusters.sandbox.json"
SANDBOX_LIVENESS_PROCESS = "temporal"  # every client of a sandbox talks to it


def default_sandbox_dir() -> Path:
    """The default sandbox's state dir, from HOME as it is now (not at import)."""
    return Path.home() / ".autoclusters" / "sandbox"


def sandbox_running(state_dir: Path) -> bool:
    """Whether the sandbox in `state_dir` runs: its record exists and its Temporal server's
    recorded PID is alive with the recorded start time (a reused PID is not ours).

    A minimal, read-only copy of sandbox/runtime/processes.py's check: core imports no sandbox code.
    """
    if not (state_dir / SANDBOX_RECORD_NAME).is_file():
        return False
    try:
        rec = json.loads((state_dir / "pids" / f"{SANDBOX_LIVENESS_PROCESS}.json").read_text())
        pid, ticks = int(rec["pid"]), int(rec["start_ticks"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return pid > 0 and start_ticks(pid) == ticks


def config_file() -> Path | None:
    """AUTOCLUSTERS_CONFIG; else the default sandbox's file while that sandbox runs."""
    if os.environ.get("AUTOCLUSTERS_CONFIG"):
        return Path(os.environ["AUTOCLUSTERS_CONFIG"])
    state_dir = default_sandbox_dir()
    default = state_dir / CONFIG_FILE_NAME
    return default if default.exists() and sandbox_running(state_dir) else None


class Settings(BaseSettings):
    """What every entry point shares: the cluster and its policy at the top, then one group
    per thing an operator configures (core/settings_groups.py)."""

    model_config = SettingsConfigDict(
        env_prefix="AUTOCLUSTERS_", env_nested_delimiter="__", extra="ignore"
    )

    cluster: str = "sandbox"
    policy_file: Path | None = Field(default=None, description="remediation policy (YAML)")
    log_level: str = "INFO"
    cloud_provider: Literal["crusoe"] = "crusoe"

    temporal: TemporalSettings = Field(default_factory=TemporalSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    crusoe: CrusoeSettings = Field(default_factory=CrusoeSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    remediation: RemediationSettings = Field(default_factory=RemediationSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings)
    approval: ApprovalSettings = Field(default_factory=ApprovalSettings)
    handoff: HandoffSettings = Field(default_factory=HandoffSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    # Slack: one thread per incident, approval buttons; None: Slack is off.
    slack: SlackConfig | None = None

    # The API, flat like the API's own settings (api_*, clients/web/settings.py): where
    # people reach it (the incident links in Slack), and the CLI's way to it
    # (`autoclusters approve`): its address (default: api_public_url, else the API's
    # default address) and the person's own operator token, which says who they are.
    api_public_url: str | None = None
    api_url: str | None = Field(default=None, description="the API, for the CLI's decisions")
    api_token: SecretStr | None = Field(
        default=None, description="your own operator token: the CLI decides as its person"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_old_names(cls, data: object) -> object:
        if isinstance(data, dict) and (old := renamed_in(data, os.environ)):
            raise ValueError("settings renamed: " + "; ".join(old))
        return data

    def api_base_url(self) -> str:
        return (self.api_url or self.api_public_url or "http://127.0.0.1:8480").rstrip("/")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = config_file()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def load(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]


def load_file(path: Path) -> Settings:
    """Exactly the settings in one TOML file (a sandbox's), whatever the environment says."""
    with open(path, "rb") as f:
        return Settings(**tomllib.load(f))


def policy_for(settings: Settings) -> Policy:
    """The cluster's remediation policy: the configured file, or the shipped default."""
    if settings.policy_file is None:
        return default_policy()
    return load_policy(settings.policy_file)
