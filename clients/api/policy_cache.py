"""The cluster's policy as the API sees it: read again when its file changes."""

from __future__ import annotations

import logging

from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.policy import Policy, PolicyError
from autoclusters.core.settings import policy_for

log = logging.getLogger("autoclusters.api")


class PolicyCache:
    """The cluster's policy, read again when its file changes (a broken edit keeps the
    last good one, loudly)."""

    def __init__(self, settings: ApiSettings) -> None:
        self._settings = settings
        self._policy = policy_for(settings)
        self._mtime = self._stat()

    def _stat(self) -> int | None:
        path = self._settings.policy_file
        try:
            return path.stat().st_mtime_ns if path is not None else None
        except OSError:
            return None

    def current(self) -> Policy:
        mtime = self._stat()
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._policy = policy_for(self._settings)
            except PolicyError as e:
                log.error("policy file changed but is invalid; keeping the previous one: %s", e)
        return self._policy
