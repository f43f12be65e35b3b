"""The topology page at fleet scale in a real headless Chromium (Debian's chromium and
chromedriver, through Selenium), against the API with its console reading a synthetic
fleet of 2,000 nodes (bench/console.py --serve: tests/fakes/fleet.py, no sandbox), where
every read finds one node's job turned over, so each poll changes the page:

- it draws one cell per node and sets its `topology-drawn` mark;
- search by name leaves that node alone, Enter goes to it (its details shown), Enter again
  opens its page;
- the state, fault and node-set filters each leave only what they name, the counts agree,
  the filters are in the URL and survive the page's polls, Clear brings every node back;
- the keyboard: one Tab stop per group, the arrow keys move between cells and keep focus
  across polls;
- four nodes still get readable tiles with their names;
- a page whose data ages past the bound (Slurm stops answering) says it is stale and
  keeps showing the last data;
- the fleet page charts incidents per day by fault and lists recovery times and gates;
- a node's page draws one chart per metric with every GPU a series (from a stand-in
  Prometheus answering `query_range`), and the range buttons ask for 1 h, 6 h or 24 h.

Screenshots go to build/test-artifacts/console/ and, when AUTOCLUSTERS_SCREENSHOTS=docs,
to docs/console-topology-fleet.png, docs/console-topology-filtered.png and
docs/console-node-charts.png and docs/console-fleet.png.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "build" / "test-artifacts" / "console"
TO_DOCS = os.environ.get("AUTOCLUSTERS_SCREENSHOTS") == "docs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

webdriver = pytest.importorskip("selenium.webdriver")
if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    pytest.skip(
        "needs Debian's chromium and chromium-driver (scripts/system-deps.sh)",
        allow_module_level=True,
    )

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

from tests.fakes.fleet import FleetSource  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(nodes: int, *extra: str) -> Iterator[str]:
    port = free_port()
    api = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "console.py"), "--serve", "--nodes", str(nodes),
         "--port", str(port), "--read-ms", "0", *extra],
        cwd=REPO,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert api.poll() is None, f"the API exited ({api.returncode})"
            try:
                if httpx.get(f"{base}/ui/api/topology", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the API never answered"
            time.sleep(0.2)
        yield base
    finally:
        api.terminate()  # by its own PID
        try:
            api.wait(10)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait()


@pytest.fixture(scope="module")
def fleet_url() -> Iterator[str]:
    yield from serve(2000)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One browser for the module's tests (each launch of Chromium under chromedriver cost
    ~2-4 s of CPU on a loaded machine); `browser` hands it to each test with nothing left
    of the one before."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="console-browser-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
                f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()  # stops chromedriver (by its own PID) and the browser it started
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's browser on a blank page, without the last test's cookies (the console
    keeps nothing else in the browser); the last test left it on a blank page."""
    chromium.execute_cdp_cmd("Network.clearBrowserCookies", {})
    yield chromium
    chromium.get("about:blank")  # the page stops polling its server before that goes


def screenshot(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    if TO_DOCS:
        shutil.copyfile(path, REPO / "docs" / f"console-{name}.png")


SHOWN = """return Array.from(document.querySelectorAll('#topology a.tile'))
  .filter((c) => !c.closest('[hidden]'))
  .map((c) => [c.dataset.node, c.dataset.state, c.dataset.fault || '',
                c.closest('.group').dataset.group]);"""


def shown(driver: Any) -> list[list[str]]:
    rows: list[list[str]] = driver.execute_script(SHOWN)
    return rows


def open_topology(driver: Any, url: str) -> None:
    driver.get(url)
    WebDriverWait(driver, 60, 0.05).until(
        lambda d: d.execute_script("return performance.getEntriesByName('topology-drawn').length"),
        "the page never set its topology-drawn mark",
    )


def next_poll(driver: Any) -> None:
    """Wait for the page's next poll to have been applied (its live stamp changes)."""
    before = driver.find_element(By.ID, "live").text
    WebDriverWait(driver, 20, 0.1).until(
        lambda d: d.find_element(By.ID, "live").text not in (before, "live"),
        "the page never polled",
    )


def test_search_finds_a_node_and_enter_opens_it(fleet_url: str, browser: Any) -> None:
    open_topology(browser, f"{fleet_url}/ui/topology")
    assert len(shown(browser)) == 2000
    assert browser.find_element(By.ID, "shown").text == "2000 nodes"
    screenshot(browser, "topology-fleet")
    browser.find_element(By.TAG_NAME, "body").send_keys("/")  # the key to find a node
    search = browser.switch_to.active_element
    assert search.get_attribute("id") == "search"
    search.send_keys("gpu-0042")
    WebDriverWait(browser, 5, 0.05).until(lambda d: len(shown(d)) == 1)
    assert shown(browser)[0][0] == "gpu-0042"
    assert browser.find_element(By.ID, "shown").text == "1 of 2000 nodes shown"
    assert "q=gpu-0042" in browser.current_url
    search.send_keys(Keys.ENTER)
    focused = browser.switch_to.active_element
    assert focused.get_attribute("data-node") == "gpu-0042"
    detail = browser.find_element(By.ID, "cell-detail")
    assert detail.is_displayed() and "gpu-0042" in detail.text and "8 GPU" in detail.text
    assert "leaf leaf-002" in detail.text  # where it sits (the details say "leaf")
    focused.send_keys(Keys.ENTER)
    WebDriverWait(browser, 10).until(lambda d: d.current_url.endswith("/ui/nodes/gpu-0042"))
    # A search a reload keeps: the filters live in the URL.
    open_topology(browser, f"{fleet_url}/ui/topology?q=gpu-00")
    assert len(shown(browser)) == 99
    assert browser.find_element(By.ID, "search").get_attribute("value") == "gpu-00"


def test_state_fault_and_node_set_filters_leave_only_what_they_name(
    fleet_url: str, browser: Any
) -> None:
    fleet = FleetSource(2000)  # the server's fleet: the same seed, the same nodes
    open_topology(browser, f"{fleet_url}/ui/topology")
    button = browser.find_element(By.CSS_SELECTOR, '#counts button[data-state="quarantined"]')
    want = int(button.find_element(By.TAG_NAME, "b").text)
    button.click()
    assert button.get_attribute("aria-pressed") == "true"
    rows = shown(browser)
    assert len(rows) == want and {r[1] for r in rows} == {"quarantined"}
    assert "state=quarantined" in browser.current_url
    # Per group: how many of its nodes are shown, of how many, and what they are.
    group = browser.find_element(By.XPATH, '//div[@class="group" and not(@hidden)]//h4/span')
    shown_here, total = group.text.split(" · ")[0].split("/")
    assert 0 < int(shown_here) <= int(total) and "quarantined" in group.text
    cell = browser.find_element(By.CSS_SELECTOR, f'a.tile[data-node="{rows[0][0]}"]')
    browser.execute_script("arguments[0].focus()", cell)  # its details, as a person sees them
    assert rows[0][0] in browser.find_element(By.ID, "cell-detail").text
    screenshot(browser, "topology-filtered")
    button.click()  # off again

    fault = sorted({i.request.fault for i in fleet.open.values()})[0]
    Select(browser.find_element(By.ID, "filter-fault")).select_by_value(fault)
    rows = shown(browser)
    want_nodes = sorted(n for n, i in fleet.open.items() if i.request.fault == fault)
    assert sorted(r[0] for r in rows) == want_nodes and {r[2] for r in rows} == {fault}
    Select(browser.find_element(By.ID, "filter-fault")).select_by_value("*")  # any fault
    assert sorted(r[0] for r in shown(browser)) == sorted(fleet.open)
    Select(browser.find_element(By.ID, "filter-fault")).select_by_value("")

    Select(browser.find_element(By.ID, "filter-set")).select_by_value("spares")
    rows = shown(browser)
    assert sorted(r[0] for r in rows) == fleet.sets["spares"] and {r[3] for r in rows} == {"spares"}
    assert {r[1] for r in rows} == {"spare"}
    # The page's polls (each read turns a job over) keep the filter.
    next_poll(browser)
    next_poll(browser)
    assert sorted(r[0] for r in shown(browser)) == fleet.sets["spares"]
    browser.find_element(By.ID, "filter-clear").click()
    assert len(shown(browser)) == 2000 and browser.current_url.endswith("/ui/topology")


def test_the_keyboard_moves_between_cells_and_keeps_focus_across_polls(
    fleet_url: str, browser: Any
) -> None:
    open_topology(browser, f"{fleet_url}/ui/topology")
    stops = browser.execute_script(
        "return document.querySelectorAll('#topology a.tile[tabindex=\"0\"]').length"
    )
    groups = browser.execute_script("return document.querySelectorAll('#topology .group').length")
    assert stops == groups  # one Tab stop per group, not 2,000
    first = browser.find_element(By.CSS_SELECTOR, 'a.tile[data-node="gpu-0001"]')
    assert first.get_attribute("aria-label") == "gpu-0001: in service"
    browser.execute_script("arguments[0].focus()", first)
    first.send_keys(Keys.ARROW_RIGHT)
    assert browser.switch_to.active_element.get_attribute("data-node") == "gpu-0002"
    here = browser.switch_to.active_element
    top = here.location["y"]
    here.send_keys(Keys.ARROW_DOWN)
    below = browser.switch_to.active_element
    assert below.get_attribute("data-node") != "gpu-0002" and below.location["y"] > top
    name = below.get_attribute("data-node")
    assert below.get_attribute("tabindex") == "0"  # Tab comes back here
    next_poll(browser)
    next_poll(browser)
    assert browser.switch_to.active_element.get_attribute("data-node") == name


def test_four_nodes_keep_readable_tiles(browser: Any) -> None:
    for base in serve(4):
        open_topology(browser, f"{base}/ui/topology")
        topo = browser.find_element(By.ID, "topology")
        assert "roomy" in (topo.get_attribute("class") or "")
        names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "a.tile .name")]
        assert names == ["gpu-0001", "gpu-0002", "gpu-0003", "gpu-0004"]
        search = browser.find_element(By.ID, "search")
        search.send_keys("0003")
        WebDriverWait(browser, 5, 0.05).until(lambda d: len(shown(d)) == 1)


class FakePrometheus(BaseHTTPRequestHandler):
    """`query_range` for 8 GPUs: a wave per GPU over whatever range is asked. The node page
    also polls an instant `query` for its job-step panel (every 2 s); that gets an empty
    vector and is not recorded, so `asked` holds the chart's range queries only."""

    asked: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path != "/api/v1/query_range":
            self._answer({"resultType": "vector", "result": []})
            return
        FakePrometheus.asked.append(q)
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        levels = {"DCGM_FI_DEV_GPU_UTIL": 80, "DCGM_FI_DEV_GPU_TEMP": 55,
                  "DCGM_FI_DEV_POWER_USAGE": 550, "DCGM_FI_DEV_FB_USED": 60000}  # fmt: skip
        base = levels[q["query"].split("{")[0]]
        result = [
            {"metric": {"gpu": str(g), "Hostname": "gpu-0021"},
             "values": [[t, str(base + 10 * math.sin(t / 5400 + g / 2))]
                        for t in range(int(start), int(end) + 1, int(step))]}
            for g in range(8)
        ]  # fmt: skip
        self._answer({"resultType": "matrix", "result": result})

    def _answer(self, data: dict[str, Any]) -> None:
        body = json.dumps({"status": "success", "data": data})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


CHARTS = """return Array.from(document.querySelectorAll('#charts figure.chart')).map((f) => [
  f.dataset.metric, f.querySelectorAll('.u-legend .u-series').length - 1,
  f.querySelectorAll('canvas').length]);"""


def test_a_node_page_draws_one_chart_per_metric_with_every_gpu(
    prometheus: str, browser: Any
) -> None:
    for base in serve(64, "--prometheus-url", prometheus):
        browser.get(f"{base}/ui/nodes/gpu-0021")
        WebDriverWait(browser, 30, 0.1).until(
            lambda d: len(d.execute_script(CHARTS)) == 4, "the charts never drew"
        )
        charts = browser.execute_script(CHARTS)
        want = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                "DCGM_FI_DEV_FB_USED"]  # fmt: skip
        assert [c[0] for c in charts] == want
        assert all(c[1] == 8 and c[2] >= 1 for c in charts)  # 8 GPUs each, drawn
        legend = browser.find_element(By.CSS_SELECTOR, "#charts figure .u-legend").text
        assert "GPU 0" in legend and "GPU 7" in legend
        axis = browser.find_element(
            By.CSS_SELECTOR, '#charts figure[data-metric="DCGM_FI_DEV_GPU_TEMP"]'
        )
        assert "°C" in axis.text  # units on the value axis
        marks = json.loads(browser.find_element(By.ID, "charts").get_attribute("data-marks"))
        assert [m["id"] for m in marks] == ["inc-20261201-120000-gpu-0021"]
        browser.find_element(By.CSS_SELECTOR, '#chart-range button[data-range="24h"]').click()
        WebDriverWait(browser, 30, 0.1).until(
            lambda d: d.find_element(By.ID, "charts").get_attribute("data-range") == "24h"
        )
        day = FakePrometheus.asked[-1]  # the charts drew from it, so it has been asked
        assert day["step"] == str(24 * 3600 // 240)
        assert float(day["end"]) - float(day["start"]) == 86400
        screenshot(browser, "node-charts")


def test_the_fleet_page_charts_incidents_per_day_and_recovery(fleet_url: str, browser: Any) -> None:
    browser.get(f"{fleet_url}/ui/fleet")
    WebDriverWait(browser, 30, 0.1).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#fleet-per-day canvas"), "no chart drawn"
    )
    legend = browser.find_element(By.CSS_SELECTOR, "#fleet-per-day .u-legend").text
    week = httpx.get(f"{fleet_url}/ui/api/fleet").json()
    assert all(f in legend for f in week["faults"])
    rows = browser.find_elements(By.CSS_SELECTOR, "#fleet-recovery tbody tr[data-fault]")
    assert len(rows) == len(week["recovery"]) > 0
    assert browser.find_element(By.ID, "kpi-incidents").text == str(week["incidents"])
    gates = browser.find_elements(By.CSS_SELECTOR, "#fleet-gates meter")
    assert len(gates) == len(week["gates"]) > 0
    screenshot(browser, "fleet")
    browser.find_element(By.LINK_TEXT, "30 days").click()
    WebDriverWait(browser, 30).until(lambda d: d.current_url.endswith("/ui/fleet?range=30d"))
    month = httpx.get(f"{fleet_url}/ui/api/fleet?range=30d").json()
    assert browser.find_element(By.ID, "kpi-incidents").text == str(month["incidents"])
    assert month["incidents"] >= week["incidents"]


def test_a_page_whose_data_ages_past_the_bound_says_so_and_keeps_it(browser: Any) -> None:
    # Slurm stops answering after two reads; the age bound is 2 s.
    for base in serve(64, "--max-age-s", "2", "--hang-after", "2"):
        open_topology(browser, f"{base}/ui/topology")
        WebDriverWait(browser, 30, 0.2).until(
            lambda d: "stale" in (d.find_element(By.ID, "data-age").get_attribute("class") or ""),
            "the page never said stale",
        )
        assert "stale" in browser.find_element(By.ID, "data-age").text
        assert "stale: the data is" in browser.find_element(By.ID, "errors").text
        # Once the hung read is abandoned (2 s after it began), the page also says why.
        WebDriverWait(browser, 30, 0.2).until(
            lambda d: "longer than 2 s" in d.find_element(By.ID, "errors").text,
            "the page never said why its data is old",
        )
        assert len(shown(browser)) == 64  # the last data, still there
