"""Crusoe API credentials: `CRUSOE_*` environment variables over a `~/.crusoe/config` profile.

Follows Crusoe's own tools (the Terraform provider's `internal/common/config.go`): the file is
TOML with one table per profile (`[default]`, ...) holding `access_key_id`, `secret_key`,
`default_project` and `api_endpoint`; the profile is picked by the caller, else
`CRUSOE_PROFILE`, else a top-level `profile = "..."`, else `default`; each environment
variable, when set, wins over the profile. Legacy endpoints map to the v1 one.

The secret key is a `SecretStr`: it never appears in a repr, a str, an error or a log line.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from autoclusters.integrations.crusoe.signing import SigningError, decode_secret_key

__all__ = [
    "DEFAULT_API_ENDPOINT",
    "CredentialsError",
    "CrusoeCredentials",
    "default_config_path",
    "load_credentials",
]

DEFAULT_API_ENDPOINT = "https://api.cloud.crusoe.ai/v1"
_LEGACY_ENDPOINTS = {
    "https://api.crusoecloud.com/v1alpha5": DEFAULT_API_ENDPOINT,
    "https://api.crusoecloud.com/v1": DEFAULT_API_ENDPOINT,
}
_FIELDS = ("access_key_id", "secret_key", "default_project", "api_endpoint")
_ENV = {
    "access_key_id": "CRUSOE_ACCESS_KEY_ID",
    "secret_key": "CRUSOE_SECRET_KEY",
    "default_project": "CRUSOE_DEFAULT_PROJECT",
    "api_endpoint": "CRUSOE_API_ENDPOINT",
}


class CredentialsError(ValueError):
    """No usable credentials; the message says what is missing and where we looked."""


class CrusoeCredentials(BaseModel):
    model_config = ConfigDict(frozen=True)

    access_key_id: str
    secret_key: SecretStr
    api_endpoint: str = DEFAULT_API_ENDPOINT
    default_project: str | None = None
    profile: str = "default"


def default_config_path() -> Path:
    return Path.home() / ".crusoe" / "config"


def _read_profiles(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        # The decoder's message quotes the offending line, which may hold the secret.
        raise CredentialsError(f"{path} is not valid TOML (line {_line_of(e)})") from None


def _line_of(e: tomllib.TOMLDecodeError) -> str:
    text = str(e)
    return text.rsplit("line ", 1)[-1].split(",")[0] if "line " in text else "?"


def load_credentials(
    *,
    profile: str | None = None,
    config_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> CrusoeCredentials:
    """Credentials for the Crusoe API, or CredentialsError naming what is missing.

    `environ` defaults to the process environment; tests pass their own mapping.
    """
    env = os.environ if environ is None else environ
    path = config_path if config_path is not None else default_config_path()
    data = _read_profiles(path)
    top_profile = data.get("profile") if isinstance(data.get("profile"), str) else None
    name = profile or env.get("CRUSOE_PROFILE") or top_profile or "default"
    table = data.get(name)
    section: dict[str, Any] = table if isinstance(table, dict) else {}

    values: dict[str, str] = {}
    for field in _FIELDS:
        from_file = section.get(field)
        if isinstance(from_file, str) and from_file:
            values[field] = from_file
        if env.get(_ENV[field]):
            values[field] = env[_ENV[field]]
    missing = [f for f in ("access_key_id", "secret_key") if f not in values]
    if missing:
        wanted = " and ".join(f"{_ENV[f]} / {f}" for f in missing)
        raise CredentialsError(f"no Crusoe {wanted} in the environment or [{name}] of {path}")
    try:
        decode_secret_key(values["secret_key"])
    except SigningError as e:
        raise CredentialsError(f"{e} (from {_ENV['secret_key']} or [{name}] of {path})") from None
    endpoint = values.get("api_endpoint", DEFAULT_API_ENDPOINT).rstrip("/")
    try:
        return CrusoeCredentials(
            access_key_id=values["access_key_id"],
            secret_key=SecretStr(values["secret_key"]),
            api_endpoint=_LEGACY_ENDPOINTS.get(endpoint, endpoint),
            default_project=values.get("default_project"),
            profile=name,
        )
    except ValidationError as e:
        # pydantic would quote the input, secret included: report the fields only.
        fields = ", ".join(str(err["loc"][0]) for err in e.errors() if err["loc"])
        raise CredentialsError(f"invalid Crusoe credentials: {fields}") from None
