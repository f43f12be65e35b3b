"""Where an incident's Slack message lives (channel + ts), so every event updates that one.

The record must outlive the worker process: a restarted or second worker sending the
next event of an incident has to update the same message and reply in the same thread.
`FileThreadStore` keeps one small JSON file per incident in a directory; workers on one
host (or sharing the directory) see each other's records. Workers that share nothing
still agree through the channel itself: the notifier looks the message up by its
metadata when the store has no record (see `SlackNotifier`).

Writes are atomic (temporary file + rename): a crash never leaves half a record, and a
record that cannot be read is treated as missing, never as an error.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ValidationError

from autoclusters.integrations.slack.cards import IncidentCard

__all__ = ["FileThreadStore", "MemoryThreadStore", "ThreadRecord", "ThreadStore"]

log = logging.getLogger("autoclusters.integrations.slack")


class ThreadRecord(BaseModel):
    incident_id: str
    channel: str  # the channel ID Slack answered with (chat.update needs the ID)
    ts: str  # the incident message's ts: the thread's parent
    card: IncidentCard
    last_event_key: str | None = None  # the last event told in the thread (retry guard)


class ThreadStore(Protocol):
    def get(self, incident_id: str) -> ThreadRecord | None: ...

    def put(self, record: ThreadRecord) -> None: ...


class MemoryThreadStore:
    """Records for this process only (tests; or when the history look-up is enough)."""

    def __init__(self) -> None:
        self._records: dict[str, ThreadRecord] = {}

    def get(self, incident_id: str) -> ThreadRecord | None:
        rec = self._records.get(incident_id)
        return rec.model_copy(deep=True) if rec else None

    def put(self, record: ThreadRecord) -> None:
        self._records[record.incident_id] = record.model_copy(deep=True)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class FileThreadStore:
    """One `<incident_id>.json` per incident under `directory` (created when missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, incident_id: str) -> Path:
        # Incident ids are ours (inc-<date>-<node>), but a file name must never escape.
        return self.directory / f"{_UNSAFE.sub('_', incident_id)}.json"

    def get(self, incident_id: str) -> ThreadRecord | None:
        try:
            rec = ThreadRecord.model_validate_json(self.path(incident_id).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as e:
            log.warning("unreadable Slack thread record for %s: %s", incident_id, e)
            return None
        return rec if rec.incident_id == incident_id else None

    def put(self, record: ThreadRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(record.model_dump_json(indent=1))
            os.replace(tmp, self.path(record.incident_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
