"""Inference load for the sandbox: open-loop Poisson arrivals at the gateway.

`Load(url, rps)` sends `POST {url}/v1/infer` at exponentially distributed intervals averaging
1/rps, whether or not earlier requests have come back (open loop: a slow service sees the
queue grow, as real users make it). `set_rps()` changes the rate while it runs (0 pauses).
`stats` counts what was sent, answered 2xx, and failed (any other answer, or none), with
each answered request's latency.

    async with Load(cfg.inference_gateway_url, rps=20) as load:
        await asyncio.sleep(30)
        load.set_rps(80)
        ...
    print(load.stats.summary())

CLI: `autoclusters sandbox load --rps N [--for S] [--state-dir D]`.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

from autoclusters.sandbox.inference.gateway import KEEPALIVE_S


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, answered requests
    codes: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    sending_stopped: float | None = None  # no arrival after this; the ones in flight drain
    stopped: float | None = None

    @property
    def elapsed_s(self) -> float:
        return (self.stopped or time.monotonic()) - self.started

    @property
    def sending_s(self) -> float:
        """How long arrivals were sent: the rate's window (the drain after it is the
        service's time, not the generator's)."""
        return (self.sending_stopped or self.stopped or time.monotonic()) - self.started

    def quantile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        if len(self.latencies) == 1:
            return self.latencies[0]
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[
            max(0, min(98, round(q * 100) - 1))
        ]

    def summary(self) -> dict[str, Any]:
        elapsed, sending = self.elapsed_s, self.sending_s
        return {
            "elapsed_s": round(elapsed, 2),
            "sending_s": round(sending, 2),
            "sent": self.sent,
            "ok": self.ok,
            "errors": self.errors,
            "achieved_rps": round(self.sent / sending, 2) if sending > 0 else 0.0,
            "p50_s": self.quantile(0.5),
            "p95_s": self.quantile(0.95),
            "codes": dict(self.codes),
        }


class Load:
    def __init__(
        self,
        url: str,
        rps: float,
        *,
        timeout_s: float = 60.0,
        body: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        self.url = url.rstrip("/") + "/v1/infer"
        self.rps = max(0.0, float(rps))
        self.timeout_s = timeout_s
        self.body = body if body is not None else {"prompt": "hello", "max_tokens": 16}
        self.stats = LoadStats()
        self._rng = random.Random(seed)
        self._changed = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None

    def set_rps(self, rps: float) -> None:
        self.rps = max(0.0, float(rps))
        self._changed.set()

    async def start(self) -> None:
        # Idle connections expire before the gateway's uvicorn closes them (5 s): otherwise a
        # request can go out on a connection the server is closing, and fail unanswered.
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=100, keepalive_expiry=KEEPALIVE_S
        )
        self._http = httpx.AsyncClient(timeout=self.timeout_s, limits=limits)
        self.stats = LoadStats()
        self._runner = asyncio.create_task(self._arrivals())

    async def stop(self, *, drain: bool = True) -> LoadStats:
        """Stop sending; wait for the requests in flight (or cancel them: not `drain`)."""
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        if self.stats.sending_stopped is None:
            self.stats.sending_stopped = time.monotonic()
        if self._inflight:
            if not drain:
                for t in self._inflight:
                    t.cancel()
            await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
        self.stats.stopped = time.monotonic()
        return self.stats

    async def __aenter__(self) -> Load:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop(drain=exc is None)

    async def run_for(self, seconds: float) -> LoadStats:
        await self.start()
        try:
            await asyncio.sleep(seconds)
        finally:
            stats = await self.stop()
        return stats

    async def _arrivals(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            if self.rps <= 0:
                self._changed.clear()
                await self._changed.wait()
                next_at = loop.time()
                continue
            # Scheduled from the previous arrival, not from when we woke: the rate holds
            # however late the loop runs.
            next_at += self._rng.expovariate(self.rps)
            delay = next_at - loop.time()
            if delay > 0:
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), delay)
                    next_at = loop.time()  # the rate changed: draw afresh from now
                    continue
                except TimeoutError:
                    pass
            task = asyncio.create_task(self._one())
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _one(self) -> None:
        assert self._http is not None
        self.stats.sent += 1
        start = time.monotonic()
        try:
            r = await self._http.post(self.url, json=self.body)
        except httpx.HTTPError as e:
            self.stats.errors += 1
            name = type(e).__name__
            self.stats.codes[name] = self.stats.codes.get(name, 0) + 1
            return
        self.stats.codes[str(r.status_code)] = self.stats.codes.get(str(r.status_code), 0) + 1
        if 200 <= r.status_code < 300:
            self.stats.ok += 1
            self.stats.latencies.append(time.monotonic() - start)
        else:
            self.stats.errors += 1
