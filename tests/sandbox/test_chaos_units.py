"""The pieces of `autoclusters chaos` that need no sandbox: `--at` parsing, and the Crusoe
emulator's delay rule (how `repair:before-cloud` lands its crash before the cloud call)."""

from __future__ import annotations

import time

import httpx
import pytest
from pydantic import SecretStr

from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
from autoclusters.sandbox.crusoe.world import EmulatorConfig
from autoclusters.sandbox.drivers.chaos import AT_CHOICES, ChaosError, parse_at


def test_at_names_a_step_or_a_side_of_the_repairs_cloud_call() -> None:
    assert parse_at("drain") == ("drain", None)
    assert parse_at("repair") == ("repair", None)
    assert parse_at("repair:before-cloud") == ("repair", "before-cloud")
    assert parse_at("repair:after-cloud") == ("repair", "after-cloud")
    assert "return_to_service" in AT_CHOICES
    for bad in ("drain:before-cloud", "repair:later", "reboot"):
        with pytest.raises(ChaosError, match="expected one of"):
            parse_at(bad)


def test_the_emulator_holds_back_the_next_matching_request() -> None:
    config = EmulatorConfig(
        access_key_id="k", secret_key=SecretStr("s"), project_id="p", operation_s=0.05,
        boot_delay_s=0.1,
    )  # fmt: skip
    with EmulatorServer(create_app(config)) as server:
        vm = f"{server.url}/v1/projects/p/compute/vms/instances/vm-1"
        rule = {"seconds": 0.5, "count": 1, "path_contains": "/instances/vm-1", "method": "GET"}
        assert httpx.post(f"{server.url}/_emulator/delay", json=rule).json() == {"delays": 1}

        def timed(method: str, url: str) -> float:
            t = time.monotonic()
            httpx.request(method, url, timeout=10)  # unsigned: 401, after the hold
            return time.monotonic() - t

        assert timed("GET", vm.replace("vm-1", "vm-2")) < 0.4  # another VM
        assert timed("PATCH", vm) < 0.4  # another method
        assert timed("GET", vm) >= 0.5  # held back once
        assert timed("GET", vm) < 0.4  # then no more
        httpx.post(f"{server.url}/_emulator/delay", json=rule)
        assert httpx.delete(f"{server.url}/_emulator/delay").json() == {"delays": 0}
        assert timed("GET", vm) < 0.4
