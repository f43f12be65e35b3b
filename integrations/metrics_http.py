"""`/metrics` for a process that is not a web app (the worker, the node agent): a small WSGI
server on a thread of its own, behind a bearer token once it listens off loopback.

Off loopback, whoever reaches the port would read the fleet's node names, faults and
incident counts, so a token is required there: `serve` refuses to start without one rather
than serve the page open. On loopback (a sandbox, or Prometheus on the same host) a token is
optional; when one is set it is checked there too. Prometheus sends it with
`authorization: {credentials_file: ...}`; the Prometheus Operator with a ServiceMonitor's
`authorization.credentials` (deploy/).
"""

from __future__ import annotations

import contextlib
import hmac
import selectors
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from pydantic import SecretStr

from autoclusters.core.net import is_loopback

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class OpenMetricsRefused(ValueError):
    """/metrics would listen off loopback with no token."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the process up

    def serve_until_woken(self, wake: socket.socket) -> None:
        """`serve_forever` without its 0.5 s poll for `shutdown` (the sandbox runs a dozen
        of these idle for a whole test run): sleeps until a request comes or `wake` is
        readable (`MetricsServer.stop` writes to its pair)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(wake, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if wake in ready:
                    return
                self.handle_request()  # the listening socket is readable: no wait


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass  # one line per scrape is noise; Prometheus records each scrape's outcome


def _bearer(app: WsgiApp, token: str) -> WsgiApp:
    expected = f"Bearer {token}".encode()

    def checked(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        given = environ.get("HTTP_AUTHORIZATION", "").encode()
        if not hmac.compare_digest(given, expected):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain; charset=utf-8"),
                 ("WWW-Authenticate", 'Bearer realm="metrics"')],
            )  # fmt: skip
            return [b"a bearer token is required for /metrics\n"]
        return app(environ, start_response)

    return checked


def _cached(app: WsgiApp, version: Callable[[], object]) -> WsgiApp:
    """The page as last rendered while `version()` stays the same (per path, query, Accept
    and Accept-Encoding): an agent's readings change at its checks, every 10 s, while
    Prometheus scrapes every 2 s, and rendering the page was a third of an idle agent's CPU.
    """
    lock = threading.Lock()
    pages: dict[tuple[str, ...], tuple[str, list[tuple[str, str]], bytes]] = {}
    rendered_at: list[object] = [None]  # the version `pages` hold

    def cached(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        key = tuple(
            str(environ.get(k, ""))
            for k in ("PATH_INFO", "QUERY_STRING", "HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING")
        )
        now = version()  # before rendering: a change while it renders is not cached as old
        with lock:
            if rendered_at[0] != now:
                pages.clear()
                rendered_at[0] = now
            page = pages.get(key)
        if page is None:
            got: list[tuple[str, list[tuple[str, str]]]] = []

            def keep(status: str, headers: list[tuple[str, str]], *_: Any) -> Any:
                got.append((status, list(headers)))

            body = b"".join(app(environ, keep))
            page = (got[0][0], got[0][1], body)
            with lock:
                if rendered_at[0] == now:
                    pages[key] = page
        start_response(page[0], list(page[1]))
        return [page[2]]

    return cached


class MetricsServer:
    """`registry` on `http://host:port/metrics` (any path, as prometheus-client serves it);
    port 0 picks a free one. Raises OpenMetricsRefused off loopback without a token, and
    OSError when the port is taken. With `version`, a page is rendered again only when
    `version()` returns something new (what the registry serves changes with it only)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        token: SecretStr | str | None = None,
        *,
        version: Callable[[], object] | None = None,
    ) -> None:
        # The settings' SecretStr as they hold it: unwrapped here, once, for every caller.
        if isinstance(token, SecretStr):
            token = token.get_secret_value()
        if not token and not is_loopback(host):
            raise OpenMetricsRefused(
                f"/metrics on {host} would be open to anyone who reaches it: set a metrics "
                "token (AUTOCLUSTERS_WORKER__METRICS_TOKEN / AUTOCLUSTERS_AGENT_METRICS_TOKEN) "
                "or listen on 127.0.0.1"
            )
        app: WsgiApp = make_wsgi_app(registry)
        if version is not None:
            app = _cached(app, version)
        if token:
            app = _bearer(app, token)
        server_class = _Server6 if ":" in host else _Server
        self.host = host
        self._server = make_server(host, port, app, server_class, handler_class=_Quiet)
        self._wake, wake = socket.socketpair()
        self._woken = wake
        self._thread = threading.Thread(
            target=self._server.serve_until_woken, args=(wake,), name="metrics", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # stopped already
            self._wake.send(b"x")
        self._thread.join(timeout=5)
        self._server.server_close()
        self._wake.close()
        self._woken.close()
