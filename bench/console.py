"""Console benchmark: the topology page of a fleet of N nodes, in a real headless Chromium,
and what each viewer costs the API.

Starts the API with its console (`clients/server.py`, uvicorn, its own process) reading a
synthetic fleet of `--nodes` nodes (tests/fakes/fleet.py: no sandbox; every cluster read
parses a 22.05 `sinfo --json` of that many nodes with the product's parser and takes
`--read-ms`, as sinfo and Temporal's round trips would), then:

- loads /ui/topology `--loads` times in headless Chromium (Debian's chromium and
  chromedriver, through Selenium), each a fresh navigation, and reads from the page's
  Performance API the time from navigation start to the `topology-drawn` mark the page sets
  once its cells are drawn (a page without the mark: its load event's end), and the bytes
  the page transferred (document, script, style: transferSize);
- fetches the page's poll (`/ui/api/topology`) once as is and once gzipped;
- for each of `--viewers` (default 1, 2 and 50), that many viewers poll it every 2 s (the
  page's interval, each at its own phase) for `--window-s`, and the API's CPU (its
  process's utime+stime from /proc) is divided by the window and by the polls answered.

Everything it starts is stopped by its own PID (the API; chromedriver, which takes its
browser with it). The last line printed is one JSON object with every figure.

    .venv/bin/python bench/console.py --nodes 2000
    .venv/bin/python bench/console.py --nodes 4 --loads 5 --viewers 1,50 --window-s 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

POLL_S = 2.0  # the page's poll interval (clients/console/routes.py POLL_MS)
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --- the API, in its own process ---------------------------------------------------------


def serve(
    nodes: int,
    port: int,
    read_s: float,
    churn: bool,
    prometheus_url: str | None,
    max_age_s: float | None = None,
    hang_after: int | None = None,
) -> None:
    import uvicorn

    from autoclusters.clients.console.routes import Console
    from autoclusters.clients.inventory import StaticInventory
    from autoclusters.clients.server import create_server
    from autoclusters.core.settings_groups import ConsoleSettings, MonitoringSettings
    from tests.fakes.fleet import FleetSource, node_name
    from tests.helpers import HermeticSettings

    settings = HermeticSettings(
        cluster="c1",
        api_host="127.0.0.1",
        api_port=port,
        api_tokens={"reader": "bench-reader-token-0123"},
        api_inventory="static",
        api_nodes=[f"gpu-[0001-{node_name(nodes - 1).removeprefix('gpu-')}]"],
        console=ConsoleSettings(loopback_open=True),
        monitoring=MonitoringSettings(prometheus_url=prometheus_url),
    )

    async def no_temporal() -> Any:
        raise RuntimeError("the console benchmark reads a synthetic fleet, not Temporal")

    app = create_server(
        settings, client_factory=no_temporal, inventory=StaticInventory(settings.api_nodes)
    )
    console: Console = app.state.console
    console.source = source = FleetSource(nodes, read_s=read_s, churn=churn)
    source.add_history()  # ten days of closed incidents: the fleet page's figures
    if max_age_s is not None:  # tests: a shorter age bound
        console.shared.max_age_s = console.shared.timeout_s = max_age_s
        console.shared.fresh_s = min(console.shared.fresh_s, max_age_s)
    if hang_after is not None:  # tests: Slurm stops answering after that many reads
        read = source.slurm_nodes

        async def hangs() -> Any:
            if source.reads >= hang_after:
                await asyncio.Event().wait()
            return await read()

        source.slurm_nodes = hangs  # type: ignore[method-assign]
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the API exited ({proc.returncode}) before answering")
        try:
            if httpx.get(f"{base}/ui/api/topology", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the API did not answer {base}/ui/api/topology in {timeout_s} s")


# --- the page in Chromium ----------------------------------------------------------------

DRAWN_JS = """
const mark = performance.getEntriesByName('topology-drawn')[0];
const nav = performance.getEntriesByType('navigation')[0];
if (!nav || (!mark && nav.loadEventEnd === 0)) return null;
const res = performance.getEntriesByType('resource');
return {
  drawn_ms: mark ? mark.startTime : nav.loadEventEnd,
  by: mark ? 'mark' : 'load',
  transferred: nav.transferSize + res.reduce((a, r) => a + r.transferSize, 0),
  decoded: nav.decodedBodySize + res.reduce((a, r) => a + r.decodedBodySize, 0),
  cells: document.querySelectorAll('[data-node]').length,
  response_ms: nav.responseEnd,
  dom_interactive_ms: nav.domInteractive,
};
"""


def browser_loads(base: str, loads: int, profile: Path) -> list[dict[str, Any]]:
    from selenium import webdriver
    from selenium.webdriver.support.wait import WebDriverWait

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver_bin = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
                f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=driver_bin)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(f"{base}/ui/topology")  # a first load warms the API's templates
        WebDriverWait(driver, 60, 0.05).until(lambda d: d.execute_script(DRAWN_JS))
        out = []
        for _ in range(loads):
            driver.get("about:blank")
            driver.get(f"{base}/ui/topology")
            got = WebDriverWait(driver, 60, 0.05).until(lambda d: d.execute_script(DRAWN_JS))
            out.append(got)
        return out
    finally:
        driver.quit()  # stops chromedriver by its own PID, and the browser it started


# --- viewers -----------------------------------------------------------------------------


async def viewers(base: str, count: int, window_s: float, pid: int) -> dict[str, Any]:
    """`count` viewers polling the topology JSON every POLL_S for `window_s`: the API's CPU."""
    answered: list[float] = []  # each poll's latency
    ages: list[float] = []  # the Age each answer gave
    changed: list[int] = []  # answers with a body (not 304)
    limits = httpx.Limits(max_connections=count + 1, max_keepalive_connections=count + 1)
    headers = {"Accept": "application/json", "Accept-Encoding": "gzip"}
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        # Connections first, outside the measured window.
        await asyncio.gather(*(client.get("/ui/api/topology", headers=headers)
                               for _ in range(count)))  # fmt: skip
        start = time.monotonic()
        end = start + window_s

        async def viewer(phase: float) -> None:
            # As the page polls: If-None-Match with the last ETag; the body only on a 200.
            t, etag = start + phase, ""
            while t < end:
                await asyncio.sleep(max(0.0, t - time.monotonic()))
                sent = time.monotonic()
                asked = {**headers, "If-None-Match": etag} if etag else headers
                r = await client.get("/ui/api/topology", headers=asked)
                if r.status_code != 304:
                    r.raise_for_status()
                    r.json()
                    etag = r.headers.get("ETag", "")
                    changed.append(1)
                answered.append(time.monotonic() - sent)
                if "Age" in r.headers:
                    ages.append(float(r.headers["Age"]))
                t += POLL_S

        rng = random.Random(count)
        cpu0 = cpu_s(pid)
        await asyncio.gather(*(viewer(rng.uniform(0, POLL_S)) for _ in range(count)))
        cpu = cpu_s(pid) - cpu0
        took = time.monotonic() - start
    answered.sort()
    return {
        "viewers": count,
        "polls": len(answered),
        "api_cpu_ms_per_s": round(cpu / took * 1000, 1),
        "api_cpu_ms_per_poll": round(cpu / max(1, len(answered)) * 1000, 2),
        "polls_with_body": len(changed),
        "poll_ms_p50": round(statistics.median(answered) * 1000, 1),
        "poll_ms_max": round(answered[-1] * 1000, 1),
        "data_age_s_max": round(max(ages), 2) if ages else None,
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, __file__, "--serve", "--nodes", str(args.nodes), "--port", str(port),
           "--read-ms", str(args.read_ms), *(["--static"] if args.static else [])]  # fmt: skip
    api = subprocess.Popen(cmd, cwd=ROOT)
    try:
        wait_ready(base, api)
        plain = httpx.get(f"{base}/ui/api/topology", headers={"Accept-Encoding": "identity"})
        zipped = httpx.get(f"{base}/ui/api/topology", headers={"Accept-Encoding": "gzip"})
        with tempfile.TemporaryDirectory(prefix="bench-console-") as profile:
            loads = browser_loads(base, args.loads, Path(profile))
        render = [x["drawn_ms"] for x in loads]
        cost = {str(n): asyncio.run(viewers(base, n, args.window_s, api.pid)) for n in args.viewers}
    finally:
        api.terminate()  # by its own PID
        try:
            api.wait(10)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait()
    return {
        "nodes": args.nodes,
        "loads": len(loads),
        "render_ms_p50": round(statistics.median(render), 1),
        "render_ms_p95": round(pct(render, 0.95), 1),
        "render_ms_all": [round(x, 1) for x in render],
        "drawn_by": loads[-1]["by"],
        # Where the time goes: the page's HTML fully received, then parsed.
        "response_end_ms_p50": round(statistics.median(x["response_ms"] for x in loads), 1),
        "dom_interactive_ms_p50": round(
            statistics.median(x["dom_interactive_ms"] for x in loads), 1
        ),
        "cells": loads[-1]["cells"],
        "page_transferred_bytes": loads[-1]["transferred"],
        "page_decoded_bytes": loads[-1]["decoded"],
        "poll_json_bytes": len(plain.content),
        "poll_json_gzip_bytes": zipped.num_bytes_downloaded,
        "read_ms": args.read_ms,
        "churn": not args.static,
        "viewers": cost,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--loads", type=int, default=7, help="page loads measured (>= 5)")
    p.add_argument("--viewers", default="1,2,50", help="viewer counts, comma separated")
    p.add_argument("--window-s", type=float, default=20.0, help="how long each viewer count polls")
    p.add_argument("--read-ms", type=float, default=100.0, help="how long a cluster read takes")
    p.add_argument(
        "--static",
        action="store_true",
        help="the fleet never changes (default: one node's job turns over per read)",
    )
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--prometheus-url", default=None, help=argparse.SUPPRESS)
    p.add_argument("--max-age-s", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--hang-after", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.nodes < 1:
        p.error("--nodes: at least 1")
    if args.serve:
        serve(args.nodes, args.port, args.read_ms / 1000, not args.static, args.prometheus_url,
              args.max_age_s, args.hang_after)  # fmt: skip
        return
    if args.loads < 5:
        p.error("--loads: at least 5 (a p95 of fewer says little)")
    try:
        args.viewers = [int(v) for v in args.viewers.split(",") if v]
    except ValueError:
        p.error(f"--viewers: comma-separated counts, not {args.viewers!r}")
    result = bench(args)
    for n, c in result["viewers"].items():
        print(f"{n:>3} viewers: API {c['api_cpu_ms_per_s']} ms CPU/s, "
              f"{c['api_cpu_ms_per_poll']} ms/poll over {c['polls']} polls")  # fmt: skip
    print(f"render p50 {result['render_ms_p50']} ms, p95 {result['render_ms_p95']} ms; "
          f"page {result['page_transferred_bytes']:,} B; poll JSON {result['poll_json_bytes']:,} B "
          f"({result['poll_json_gzip_bytes']:,} B gzipped)")  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
