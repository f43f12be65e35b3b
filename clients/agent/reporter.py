"""Getting reports to the API without losing one: a write-ahead spool, then POSTs in order.

Every report is first written to the spool directory (one file per report: written to a
temporary name, fsynced, renamed, the directory fsynced), then sent. A report leaves the
spool only when the API has accepted it (2xx, or 409: it already has that report_id), so
a crash, an outage or an agent restart loses nothing: the next flush (by any agent over the
same directory) sends what is left, oldest first. The API deduplicates on report_id, so a
report sent twice (accepted, then the agent died before deleting the file) is harmless.

The head of the queue blocks the rest, so the API sees a node's reports in order (a
"resolved" never overtakes its "firing"). Transport errors, 408, 429 and 5xx are retried
with backoff; so are 401, 403 and 404, which mean the agent is misconfigured and would
lose reports if it dropped them. Other 4xx mean the API cannot ever take that report: it
is moved to `rejected/` with the answer beside it, and the queue moves on.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Protocol

import httpx

from autoclusters.core.node_report import (
    REPORTS_PATH,
    SNAPSHOTS_PATH,
    HealthSnapshot,
    NodeReport,
)
from autoclusters.integrations.tls import default_verify

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{12})-([0-9a-f-]{1,64})\.json$")
# 401/403/404: wrong token or URL. Keep the reports until an operator fixes the setting.
_RETRY_STATUSES = {401, 403, 404, 408, 425, 429}


class ReportSink(Protocol):
    def submit(self, reports: list[NodeReport]) -> None: ...

    def flush(self) -> object: ...


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a reader sees the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """The reports not yet accepted, one file each, named `<seq>-<report_id>.json`."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._seq = max(
            (int(m.group(1)) for p in self.pending() if (m := _NAME.match(p.name))), default=0
        )

    def put(self, report: NodeReport) -> Path:
        self._seq += 1
        path = self.dir / f"{self._seq:012d}-{report.report_id}.json"
        write_atomic(path, report.model_dump_json().encode())
        return path

    def pending(self) -> list[Path]:
        """Oldest first."""
        return sorted(p for p in self.dir.iterdir() if _NAME.match(p.name))

    def load(self, path: Path) -> NodeReport:
        return NodeReport.model_validate_json(path.read_bytes())

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        fsync_dir(self.dir)

    def reject(self, path: Path, why: str) -> None:
        rejected = self.dir / "rejected"
        rejected.mkdir(exist_ok=True)
        write_atomic(rejected / f"{path.name}.why", why.encode())
        os.replace(path, rejected / path.name)
        fsync_dir(self.dir)


class Outcome(Enum):
    SENT = "sent"
    RETRY = "retry"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Answer:
    outcome: Outcome
    detail: str


class HttpSender:
    """POST {api}/v1/reports with a bearer token; one call, one answer, never raises."""

    def __init__(
        self,
        *,
        api: str,
        token: str | None,
        timeout_s: float = 5.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = api.rstrip("/") + REPORTS_PATH
        self.snapshots_url = api.rstrip("/") + SNAPSHOTS_PATH
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client or httpx.Client(
            timeout=timeout_s, headers=headers, trust_env=False, verify=default_verify(False)
        )

    def send(self, report: NodeReport) -> Answer:
        # 409: the API has this report already (a replay after an outage): delivered.
        return self._post(self.url, report.model_dump_json(), also_sent=(409,))

    def send_snapshot(self, snapshot: HealthSnapshot) -> Answer:
        """One try, never raises: a snapshot is not spooled (the next one supersedes it)."""
        return self._post(self.snapshots_url, snapshot.model_dump_json())

    def _post(self, url: str, body: str, also_sent: tuple[int, ...] = ()) -> Answer:
        try:
            r = self._client.post(url, content=body, headers={"Content-Type": "application/json"})
        except httpx.HTTPError as e:
            return Answer(Outcome.RETRY, f"{type(e).__name__}: {e}")
        detail = f"HTTP {r.status_code} {r.text[:500]}"
        if r.is_success or r.status_code in also_sent:
            return Answer(Outcome.SENT, detail)
        if r.status_code >= 500 or r.status_code in _RETRY_STATUSES:
            return Answer(Outcome.RETRY, detail)
        return Answer(Outcome.REJECTED, detail)

    def close(self) -> None:
        self._client.close()


class Sender(Protocol):
    def send(self, report: NodeReport) -> Answer: ...


@dataclass
class FlushResult:
    sent: int = 0
    rejected: int = 0
    pending: int = 0
    deferred: bool = False  # the API was down: the next flush waits for the backoff


class Reporter:
    """The spool plus a sender: `submit` spools, `flush` sends what is spooled, in order."""

    def __init__(
        self,
        *,
        spool: Spool,
        sender: Sender,
        attempts: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], object] = time.sleep,
    ) -> None:
        self.spool = spool
        self.sender = sender
        self._attempts = attempts
        self._backoff = backoff_s
        self._max_backoff = max_backoff_s
        self._clock = clock
        self._wait = wait
        self._failures = 0
        self._next_at = 0.0
        self.last_error = ""

    def submit(self, reports: list[NodeReport]) -> None:
        for r in reports:
            self.spool.put(r)

    def flush(self, *, force: bool = False) -> FlushResult:
        """Send the spool, oldest first; stop at the first report the API cannot take now."""
        res = FlushResult()
        if not force and self._clock() < self._next_at:
            res.pending, res.deferred = len(self.spool.pending()), True
            return res
        for path in self.spool.pending():
            try:
                report = self.spool.load(path)
            except (OSError, ValueError) as e:
                self.spool.reject(path, f"unreadable: {e}")
                res.rejected += 1
                continue
            answer = self._send(report)
            if answer.outcome is Outcome.SENT:
                self.spool.remove(path)
                res.sent += 1
            elif answer.outcome is Outcome.REJECTED:
                log.error("report %s rejected: %s", report.report_id, answer.detail)
                self.spool.reject(path, answer.detail)
                res.rejected += 1
            else:
                self._failures += 1
                delay = min(self._max_backoff, self._backoff * 2 ** (self._failures + 1))
                self._next_at = self._clock() + delay
                self.last_error = answer.detail
                log.warning("API not taking reports (%s); retry in %.1f s", answer.detail, delay)
                res.deferred = True
                break
        else:
            self._failures, self._next_at = 0, 0.0
        res.pending = len(self.spool.pending())
        return res

    def _send(self, report: NodeReport) -> Answer:
        answer = Answer(Outcome.RETRY, "not sent")
        for attempt in range(self._attempts):
            if attempt:
                self._wait(min(self._max_backoff, self._backoff * 2 ** (attempt - 1)))
            answer = self.sender.send(report)
            if answer.outcome is not Outcome.RETRY:
                return answer
        return answer


class PrintSink:
    """`--print`: each report as one JSON line on stdout, nothing sent, nothing spooled."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self._out = out

    def submit(self, reports: list[NodeReport]) -> None:
        out = self._out or sys.stdout
        for r in reports:
            out.write(r.model_dump_json() + "\n")
        out.flush()

    def flush(self) -> None:
        pass
