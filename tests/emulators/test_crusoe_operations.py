"""The Crusoe emulator's own record of the operations it performed (`/_emulator/operations`):
what chaos counts cloud operations from. It names each operation's machine, also after the
VM was deleted, and keeps the record across a restart with a state file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from autoclusters.integrations.crusoe.signing import format_timestamp, sign
from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
from autoclusters.sandbox.crusoe.world import InMemoryBackend
from tests import loopback
from tests.emulators.test_crusoe import KEY_ID, SECRET, SEED, VMS, _config
from tests.helpers import eventually


class Emu:
    def __init__(self, state_file: Path | None = None) -> None:
        self.server = EmulatorServer(create_app(_config(state_file=state_file), InMemoryBackend()))
        self.server.start()

    def admin(self, method: str, path: str, **kw: Any) -> Any:
        r = loopback.request(method, f"{self.server.url}/_emulator{path}", **kw)
        r.raise_for_status()
        return r.json()

    def signed(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        ts = format_timestamp(datetime.now(UTC))
        headers = sign(
            method=method, path=path, query="", timestamp=ts, access_key_id=KEY_ID,
            secret_key=SECRET,
        )  # fmt: skip
        content = json.dumps(body).encode() if body is not None else None
        r = loopback.request(
            method, self.server.url + path, headers={**headers, "Content-Type": "application/json"},
            content=content,
        )  # fmt: skip
        r.raise_for_status()
        return r.json()

    def vm_id(self, name: str) -> str:
        vms = self.admin("GET", "/state")["vms"].values()
        return str(next(vm["id"] for vm in vms if vm["name"] == name))

    async def done(self, vm_name: str, count: int) -> list[dict[str, Any]]:
        async def finished() -> list[dict[str, Any]] | None:
            ops = self.admin("GET", "/operations", params={"vm_name": vm_name})["operations"]
            return ops if len(ops) == count and all(o["completed_at"] for o in ops) else None

        return await eventually(finished, 10, f"{count} operations on {vm_name}")


@pytest.fixture
def emu() -> Iterator[Emu]:
    e = Emu()
    try:
        e.admin("POST", "/vms", json=SEED)
        yield e
    finally:
        e.server.stop()


async def test_operations_name_their_machine_even_after_a_delete(emu: Emu) -> None:
    before = datetime.now(UTC).isoformat()
    emu.signed("PATCH", f"{VMS}/{emu.vm_id('gpu-01')}", {"action": "RESET"})
    deleted = emu.vm_id("gpu-02")
    emu.signed("DELETE", f"{VMS}/{deleted}")

    reset = await emu.done("gpu-01", 1)
    assert [(o["action"], o["state"], o["kind"]) for o in reset] == [("RESET", "SUCCEEDED", "vm")]
    (delete,) = await emu.done("gpu-02", 1)
    assert delete["action"] == "DELETE" and delete["vm_id"] == deleted
    # The pool's replacement booted under the same name: not an operation of ours.
    assert emu.vm_id("gpu-02") != deleted
    assert emu.admin("GET", "/operations", params={"vm_name": "gpu-03"})["operations"] == []
    every = emu.admin("GET", "/operations", params={"since": before})["operations"]
    assert {o["vm_name"] for o in every} == {"gpu-01", "gpu-02"}
    later = datetime.now(UTC).isoformat()
    assert emu.admin("GET", "/operations", params={"since": later})["operations"] == []
    # The record is the emulator's, not the API's: operation answers do not carry it.
    op = emu.signed("GET", f"{VMS}/operations/{delete['operation_id']}")
    assert "resource_name" not in op and "vm_name" not in op


def test_a_bad_since_is_400(emu: Emu) -> None:
    r = loopback.get(f"{emu.server.url}/_emulator/operations", params={"since": "yesterday"})
    assert r.status_code == 400 and "RFC 3339" in r.json()["message"]


async def test_the_record_survives_a_restart_with_a_state_file(tmp_path: Path) -> None:
    state = tmp_path / "world.json"
    first = Emu(state)
    try:
        first.admin("POST", "/vms", json=SEED)
        first.signed("PATCH", f"{VMS}/{first.vm_id('gpu-01')}", {"action": "RESET"})
        await first.done("gpu-01", 1)
    finally:
        first.server.stop()
    second = Emu(state)
    try:
        ops = second.admin("GET", "/operations", params={"vm_name": "gpu-01"})["operations"]
        assert [o["action"] for o in ops] == ["RESET"]
    finally:
        second.server.stop()
