"""Slack: the incident channel and its Approve / Reject buttons.

Modules, one concern each: `config` (the settings group), `client` (the Web API client
with its retries), `cards` (the incident message and its thread replies, pure),
`store` (where each incident's message lives, across restarts), `notifier` (the
`SlackNotifier`), `interactivity` (signed button clicks → decisions), `socket_mode`
(the same clicks over Slack's WebSocket), `fanout` (`MultiNotifier`, `WebhookNotifier`),
and `escape` (outside words as words: the only maker of the mrkdwn the others send).
"""

from autoclusters.core.slack_config import SlackConfig
from autoclusters.integrations.slack.cards import IncidentCard, Links
from autoclusters.integrations.slack.client import slack_web_client, web_client_for
from autoclusters.integrations.slack.fanout import MultiNotifier, WebhookNotifier
from autoclusters.integrations.slack.interactivity import (
    ApproverDirectory,
    Click,
    Decide,
    InteractionHandler,
    InteractionResponse,
    parse_click,
)
from autoclusters.integrations.slack.notifier import SlackNotifier
from autoclusters.integrations.slack.socket_mode import SocketModeRunner
from autoclusters.integrations.slack.store import (
    FileThreadStore,
    MemoryThreadStore,
    ThreadRecord,
    ThreadStore,
)

__all__ = [
    "ApproverDirectory",
    "Click",
    "Decide",
    "FileThreadStore",
    "IncidentCard",
    "InteractionHandler",
    "InteractionResponse",
    "Links",
    "MemoryThreadStore",
    "MultiNotifier",
    "SlackConfig",
    "SlackNotifier",
    "SocketModeRunner",
    "ThreadRecord",
    "ThreadStore",
    "WebhookNotifier",
    "parse_click",
    "slack_web_client",
    "web_client_for",
]
