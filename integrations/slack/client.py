"""The Slack Web API client, built once with the retries AutoClusters relies on.

A 429 is retried after the Retry-After Slack names, a connection error or a 500/503 once
after a short backoff. Each call is bounded by `timeout_s`; the caller bounds the whole
(the notifier never waits on Slack longer than its `send_timeout_s`).
"""

from __future__ import annotations

from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from autoclusters.core.slack_config import SLACK_API_URL, SlackConfig

__all__ = ["slack_web_client", "web_client_for"]


def slack_web_client(
    *,
    token: str,
    base_url: str = SLACK_API_URL,
    timeout_s: int = 5,
    rate_limit_retries: int = 2,
) -> AsyncWebClient:
    """An `AsyncWebClient` for `base_url` (Slack, or the sandbox's emulator)."""
    return AsyncWebClient(
        token=token,
        base_url=base_url,
        timeout=timeout_s,
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=1),
            AsyncRateLimitErrorRetryHandler(max_retry_count=rate_limit_retries),
            AsyncServerErrorRetryHandler(max_retry_count=1),
        ],
    )


def web_client_for(config: SlackConfig) -> AsyncWebClient:
    return slack_web_client(
        token=config.token.get_secret_value(),
        base_url=config.base_url,
        timeout_s=config.request_timeout_s,
        rate_limit_retries=config.rate_limit_retries,
    )
