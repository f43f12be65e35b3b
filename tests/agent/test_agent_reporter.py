"""The agent's reporter against a real HTTP server on 127.0.0.1 (no transport mocks):

- a report is POSTed to /v1/reports with the bearer token, as a NodeReport body;
- 5xx and dropped connections are retried with backoff within one flush;
- while the API is down reports wait in the spool (one complete file each, no temporary
  files left) and are replayed in order once it answers;
- a new reporter (an agent restart) sends what the old one left;
- 409 counts as delivered; a 422 is set aside in rejected/ and the queue moves on; 401 is
  kept for when the token is fixed;
- after a failed flush the next waits for the backoff;
- end to end: `agent run` in a subprocess reports an injected Xid and a cleared fault.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from autoclusters.clients.agent.reporter import HttpSender, Reporter, Spool
from autoclusters.core.node_report import REPORTS_PATH, NodeReport

TOKEN = "s3cret"
ROOT = Path(__file__).resolve().parents[2]


class Api:
    """A tiny report API: records every POST; answers from a script of status codes."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.posts: list[dict[str, Any]] = []
        self.script: list[int] = []  # statuses to answer next; then 200
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def accepted(self) -> list[NodeReport]:
        with self.lock:
            return [
                NodeReport.model_validate(p["body"])
                for p in self.posts
                if p["status"] < 300 and p["path"] == REPORTS_PATH  # not the health snapshots
            ]

    def start(self) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with api.lock:
                    status = api.script.pop(0) if api.script else 200
                    api.posts.append(
                        {"path": self.path, "auth": self.headers.get("Authorization"),
                         "body": body, "status": status}
                    )  # fmt: skip
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"ok": true}')

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join()
            self._server = None


@pytest.fixture
def api() -> Iterator[Api]:
    a = Api()
    a.start()
    yield a
    a.stop()


def report(n: int, fault: str = "XID_79") -> NodeReport:
    at = datetime(2026, 5, 1, tzinfo=UTC) + timedelta(seconds=n)
    return NodeReport.build(
        node="gpu-02", fault=fault, state="firing", observed_at=at, since=at,
        message=f"report {n}", evidence={"subjects": [{"gpu": 0, "n": n}]},
    )  # fmt: skip


def reporter(
    spool: Path, api: Api, *, clock: Callable[[], float] = time.monotonic, token: str = TOKEN
) -> Reporter:
    return Reporter(
        spool=Spool(spool),
        sender=HttpSender(api=api.url, token=token, timeout_s=2),
        attempts=3,
        backoff_s=0.01,
        max_backoff_s=30,
        clock=clock,
    )


def test_a_report_is_posted_with_the_token(tmp_path: Path, api: Api) -> None:
    rep = reporter(tmp_path, api)
    r = report(1)
    rep.submit([r])
    res = rep.flush()
    assert (res.sent, res.pending) == (1, 0)
    (post,) = api.posts
    assert post["path"] == "/v1/reports" and post["auth"] == f"Bearer {TOKEN}"
    assert NodeReport.model_validate(post["body"]) == r
    assert list(tmp_path.iterdir()) == []


def test_server_errors_are_retried_within_a_flush(tmp_path: Path, api: Api) -> None:
    api.script = [503, 500]
    rep = reporter(tmp_path, api)
    rep.submit([report(1)])
    assert rep.flush().sent == 1
    assert [p["status"] for p in api.posts] == [503, 500, 200]
    assert len({p["body"]["report_id"] for p in api.posts}) == 1


def test_spooled_while_down_then_replayed_in_order(tmp_path: Path, api: Api) -> None:
    api.stop()
    rep = reporter(tmp_path, api)
    sent = [report(n) for n in range(5)]
    for r in sent:
        rep.submit([r])
        res = rep.flush(force=True)
        assert res.deferred and res.sent == 0
    files = sorted(tmp_path.iterdir())
    assert len(files) == 5 and not [f for f in files if f.name.startswith(".")]
    assert [NodeReport.model_validate_json(f.read_text()) for f in files] == sent
    api.start()
    res = rep.flush(force=True)
    assert (res.sent, res.pending) == (5, 0)
    assert api.accepted == sent


def test_a_restarted_agent_sends_what_the_last_one_left(tmp_path: Path, api: Api) -> None:
    api.stop()
    old = reporter(tmp_path, api)
    old.submit([report(1), report(2)])
    old.flush(force=True)
    api.start()
    new = reporter(tmp_path, api)  # a new process over the same spool
    new.submit([report(3)])  # numbered after what is already there
    assert new.flush().sent == 3
    assert [r.message for r in api.accepted] == ["report 1", "report 2", "report 3"]


def test_a_rejected_report_is_set_aside_and_the_queue_moves_on(tmp_path: Path, api: Api) -> None:
    api.script = [422]
    rep = reporter(tmp_path, api)
    rep.submit([report(1), report(2)])
    res = rep.flush()
    assert (res.sent, res.rejected, res.pending) == (1, 1, 0)
    assert [r.message for r in api.accepted] == ["report 2"]
    rejected = sorted(p.name for p in (tmp_path / "rejected").iterdir())
    assert len(rejected) == 2 and rejected[1].endswith(".why")


def test_duplicate_is_delivered_and_unauthorised_is_kept(tmp_path: Path, api: Api) -> None:
    api.script = [409]
    rep = reporter(tmp_path, api)
    rep.submit([report(1)])
    assert rep.flush().sent == 1
    api.script = [401, 401, 401]
    rep.submit([report(2)])
    res = rep.flush(force=True)
    assert (res.sent, res.pending, res.rejected) == (0, 1, 0) and "401" in rep.last_error
    assert rep.flush(force=True).sent == 1


def test_after_a_failed_flush_the_next_waits_for_the_backoff(tmp_path: Path, api: Api) -> None:
    now = [100.0]
    api.stop()
    rep = reporter(tmp_path, api, clock=lambda: now[0])
    rep.submit([report(1)])
    assert rep.flush().deferred
    api.start()
    assert rep.flush().deferred and api.posts == []  # still inside the backoff
    now[0] += 60
    assert rep.flush().sent == 1


def test_spool_file_is_complete_json_and_leaves_no_temporaries(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    p = spool.put(report(1))
    assert NodeReport.model_validate_json(p.read_bytes()) == report(1)
    assert sorted(tmp_path.iterdir()) == [p]


# --- end to end: the CLI's agent process ------------------------------------------------


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := check():
            return got
        threading.Event().wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "autoclusters.clients.cli.agent", *args]


@pytest.mark.integration
def test_agent_process_reports_an_injected_fault_and_its_resolution(
    tmp_path: Path, api: Api
) -> None:
    """Integration lane: it runs the agent as its own process (make unit starts none)."""
    fake = tmp_path / "gpu-02.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOCLUSTERS_")}
    env["AUTOCLUSTERS_AGENT_TOKEN"] = TOKEN
    agent = subprocess.Popen(
        cli("agent", "run", "--node", "gpu-02", "--backend", "fake", "--fake-file", str(fake),
            "--api", api.url, "--spool-dir", str(tmp_path / "spool"), "--interval", "0.1",
            "--hold-checks", "2"),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(fake.exists, "the agent to create its fake file")
        subprocess.run(
            cli("inject", "--node", "gpu-02", "--fault", "XID_79", "--fake-file", str(fake)),
            cwd=ROOT, env=env, check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            cli("inject", "--node", "gpu-02", "--fault", "ECC_DBE", "--fake-file", str(fake)),
            cwd=ROOT, env=env, check=True, capture_output=True,
        )  # fmt: skip
        wait_for(lambda: {"XID_79", "ECC_DBE"} <= {r.fault for r in api.accepted}, "reports")
        subprocess.run(
            cli("inject", "--node", "gpu-02", "--clear", "--fake-file", str(fake)),
            cwd=ROOT, env=env, check=True, capture_output=True,
        )  # fmt: skip
        wait_for(
            lambda: [r for r in api.accepted if (r.fault, r.state) == ("ECC_DBE", "resolved")],
            "ECC_DBE resolved",
        )
    finally:
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=20)
    assert agent.returncode == 0, err
    assert "Traceback" not in err
    assert all(p["auth"] == f"Bearer {TOKEN}" for p in api.posts)
    assert not list((tmp_path / "spool").glob("0*.json"))  # every report delivered
