"""Calls that may hang (NVML does, when the driver wedges) run under a timeout.

Each call runs on one daemon worker thread and the caller waits at most `timeout_s`. A call
past its timeout raises `Hung` and is abandoned: the worker stays blocked in it. While it
is blocked every further call raises `Hung` at once, naming the stuck call, instead of
piling up threads behind it; once the stuck call returns, calls go through again. The
worker is a daemon thread so a wedged driver never keeps the process from exiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

T = TypeVar("T")


class Hung(RuntimeError):
    """A call did not return within the timeout (or one before it is still stuck)."""

    def __init__(self, call: str, waited_s: float) -> None:
        self.call = call
        self.waited_s = waited_s
        super().__init__(f"{call} did not return within {waited_s:.1f} s")


class Watchdog:
    def __init__(self, *, timeout_s: float, name: str = "nvml-watchdog") -> None:
        self.timeout_s = timeout_s
        self._name = name
        self._jobs: queue.Queue[tuple[str, Callable[[], Any], Future[Any]]] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stuck: tuple[str, float] | None = None  # (call, when it started)
        self._running: tuple[str, float] | None = None

    @property
    def stuck(self) -> str | None:
        """The call the worker is blocked in, past its timeout; None when none is."""
        with self._lock:
            return self._stuck[0] if self._stuck else None

    def call(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the worker; raises Hung after `timeout_s`, or at once while stuck."""
        with self._lock:
            if self._stuck is not None:
                call, started = self._stuck
                raise Hung(call, time.monotonic() - started)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
        fut: Future[T] = Future()
        self._jobs.put((name, lambda: fn(*args), fut))
        try:
            return fut.result(timeout=self.timeout_s)
        except FutureTimeout:
            with self._lock:
                if not fut.done():
                    self._stuck = self._running or (name, time.monotonic() - self.timeout_s)
            if fut.done():
                return fut.result()
            raise Hung(name, self.timeout_s) from None

    def _work(self) -> None:
        while True:
            name, fn, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running = (name, time.monotonic())
            try:
                result = fn()
            except BaseException as e:  # handed to the caller, whatever it is
                fut.set_exception(e)
            else:
                fut.set_result(result)
            finally:
                with self._lock:
                    self._running = None
                    self._stuck = None
