"""The console in a real headless Chromium (Debian's `chromium` + `chromedriver`, driven by
Selenium) against the session's running sandbox:

- the login page takes the API's token and the topology shows every node of the sandbox;
- an XID 79 injected on a node's machine (its agent sees it and reports it) turns its tile
  quarantined (the page polls; nobody reloads it) and, once the runbook has repaired it,
  back to in service;
- the node page lists the incident, and the incident page shows the timeline's steps;
- screenshots of the topology, node and incident pages go to build/test-artifacts/console/,
  and to docs/console-*.png as well when AUTOCLUSTERS_SCREENSHOTS=docs.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from autoclusters.core.settings import Settings
from autoclusters.sandbox.drivers.demo import incident_since
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.machines.vms import VmRegistry
from autoclusters.sandbox.runtime import api_tokens
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation
from tests.helpers import eventually

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "build" / "test-artifacts" / "console"
# Read at import: the session's hermetic fixtures clear AUTOCLUSTERS_* before tests run.
TO_DOCS = os.environ.get("AUTOCLUSTERS_SCREENSHOTS") == "docs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

webdriver = pytest.importorskip("selenium.webdriver")
if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    pytest.skip(
        "needs Debian's chromium and chromium-driver (scripts/system-deps.sh)",
        allow_module_level=True,
    )

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    # The driver is the distribution's: Selenium Manager must not fetch one.
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()  # stops chromedriver (by its own PID) and the browser it started


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    if TO_DOCS:
        shutil.copyfile(path, REPO / "docs" / f"console-{name}.png")
    return path


def tile_state(node: str) -> Callable[[webdriver.Chrome], str | None]:
    def read(driver: webdriver.Chrome) -> str | None:
        try:  # the page redraws its tiles on every poll: look the tile up each time
            tile = driver.find_element(By.CSS_SELECTOR, f'a.tile[data-node="{node}"]')
            return tile.get_attribute("data-state")
        except (NoSuchElementException, StaleElementReferenceException):
            return None

    return read


def wait_for_state(
    driver: webdriver.Chrome, node: str, want: str, timeout_s: float, seen: list[str]
) -> None:
    read = tile_state(node)

    def reached(d: webdriver.Chrome) -> bool:
        state = read(d)
        if state and (not seen or seen[-1] != state):
            seen.append(state)
        return state == want

    WebDriverWait(driver, timeout_s, poll_frequency=0.1).until(
        reached, f"{node}'s tile never became {want} (seen: {seen})"
    )


async def test_the_console_follows_a_fault_from_quarantine_back_to_service(
    sandbox: SandboxConfig,
    sandbox_settings: Settings,
    sandbox_client: Client,
    browser: webdriver.Chrome,
) -> None:
    base = sandbox.api_url
    # The sandbox's console is open on loopback ([console] loopback_open); the login still
    # works as it does for a person with their own operator token.
    browser.get(f"{base}/ui/login?next=/ui/topology")
    alice = api_tokens.operator_file(sandbox, "alice").read_text().strip()
    browser.find_element(By.ID, "token").send_keys(alice)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "a.tile"))
    assert browser.current_url.endswith("/ui/topology")
    cookie = browser.get_cookie("autoclusters_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    shown = {t.get_attribute("data-node") for t in browser.find_elements(By.CSS_SELECTOR, "a.tile")}
    assert shown == set(sandbox.node_names())
    for spare in sandbox.spare_names():
        assert tile_state(spare)(browser) == "spare"

    node = sandbox.node_names()[0]
    seen: list[str] = []
    wait_for_state(browser, node, "in_service", 120, seen)
    # A real fault on the machine: its agent sees it and reports it; the incident opens.
    fault_at = time.time()
    vm = VmRegistry(sandbox.state_dir).get(node)
    assert vm is not None
    Hardware(sandbox.state_dir).inject(node, vm.vm_id, HardwareFault(fault="XID_79"))
    opened = await eventually(
        lambda: incident_since(sandbox_client, sandbox_settings.cluster, node, fault_at),
        60,
        "the agent's report opens an incident",
    )
    wait_for_state(browser, node, "quarantined", 60, seen)
    screenshot(browser, "topology")
    wait_for_state(browser, node, "in_service", 300, seen)
    assert seen[0] == "in_service" and "quarantined" in seen and seen[-1] == "in_service"
    handle = sandbox_client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    state = await handle.result()
    assert state.status == "resolved"

    browser.get(f"{base}/ui/nodes/{node}")
    WebDriverWait(browser, 60, poll_frequency=0.2).until(
        lambda d: opened.incident_id in d.find_element(By.ID, "node-incidents").text,
        "the node page never listed the incident",
    )
    assert browser.find_element(By.ID, "node-state").get_attribute("data-state") == "in_service"
    # The charts load on their own (Prometheus, when the sandbox runs one): let them settle.
    WebDriverWait(browser, 30, poll_frequency=0.2).until(
        lambda d: "loading" not in d.find_element(By.ID, "charts").text,
        "the node page's GPU charts never loaded",
    )
    screenshot(browser, "node")

    browser.get(f"{base}/ui/incidents/{opened.incident_id}")
    rows = browser.find_elements(By.CSS_SELECTOR, "#steps tr[data-step]")
    steps = [r.get_attribute("data-step") for r in rows]
    assert steps == [s.name for s in state.steps]
    assert {"drain", "repair", "health_gate", "return_to_service"} <= set(steps)
    assert browser.find_element(By.ID, "incident-status").text == "resolved"
    temporal = browser.find_element(By.ID, "temporal-link").get_attribute("href")
    assert temporal is not None and temporal.endswith(f"/workflows/{opened.workflow_id}")
    screenshot(browser, "incident")
