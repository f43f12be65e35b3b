"""What the Slack integration needs to know, as one settings group.

The worker builds a `SlackNotifier` from it and the API builds an `InteractionHandler`
from it; neither reads the environment itself (the settings module does).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr

__all__ = ["SlackConfig"]

SLACK_API_URL = "https://slack.com/api/"


class SlackConfig(BaseModel):
    """The Slack app's identity, the incident channel and who may approve."""

    token: SecretStr = Field(description="Bot token (xoxb-...): chat:write, usergroups:read")
    channel: str = Field(
        description="Channel ID (C...) where each incident gets one message and a thread; "
        "an ID, not a name, so the thread can be found again in the channel history"
    )
    base_url: str = Field(
        default=SLACK_API_URL,
        description="Slack Web API base URL; the sandbox points it at its emulator's /api/",
    )
    signing_secret: SecretStr | None = Field(
        default=None, description="Signing secret that authenticates interactivity requests"
    )
    app_token: SecretStr | None = Field(
        default=None, description="App-level token (xapp-...) for Socket Mode; None: HTTP only"
    )
    page_group_id: str | None = Field(
        default=None, description="User group (S...) mentioned on critical notifications"
    )
    approvers: dict[str, str] = Field(
        default_factory=dict,
        description="Slack user id -> approver name as the remediation policy lists it",
    )
    approver_group_id: str | None = Field(
        default=None,
        description="User group whose members may approve, as their Slack username",
    )
    store_dir: Path | None = Field(
        default=None,
        description="Directory of one JSON file per incident (the thread's channel and ts); "
        "share it between workers, or rely on the channel-history look-up",
    )
    history_lookup: bool = Field(
        default=True,
        description="Find an incident's message in the channel history (message metadata) "
        "when the store does not know it: a worker restarted elsewhere keeps the thread",
    )
    temporal_ui_url: str | None = Field(
        default=None, description="Temporal UI root for the workflow link, e.g. http://host:8233"
    )
    temporal_namespace: str = Field(default="default", description="Namespace in that link")
    api_url: str | None = Field(
        default=None, description="AutoClusters API root for the incident link"
    )
    request_timeout_s: int = Field(
        default=5, ge=1, description="One Slack API call, in seconds (the SDK takes whole s)"
    )
    send_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="One notification at most, retries and Retry-After waits included; "
        "keep it under the notify activity's start-to-close timeout (30 s)",
    )
    rate_limit_retries: int = Field(
        default=2, ge=0, description="Retries of a 429 answer, each after its Retry-After"
    )
