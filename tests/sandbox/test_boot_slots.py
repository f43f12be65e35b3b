"""Sandbox boots take turns (sandbox/boot_slots.py): no more boots at once than slots, and a
slot frees when its holder ends."""

from __future__ import annotations

import threading
from pathlib import Path

from autoclusters.sandbox.boot_slots import boot_slot


def test_two_slots_hold_two_boots_at_once(tmp_path: Path) -> None:
    with boot_slot(2, tmp_path) as first, boot_slot(2, tmp_path) as second:
        assert {first, second} == {0, 1}


def test_a_boot_waits_for_a_free_slot(tmp_path: Path) -> None:
    got_it = threading.Event()

    def second_boot() -> None:
        with boot_slot(1, tmp_path):
            got_it.set()

    with boot_slot(1, tmp_path):
        waiter = threading.Thread(target=second_boot)
        waiter.start()
        # While the only slot is held, the second boot does not start.
        assert not got_it.wait(timeout=1.0)
    assert got_it.wait(timeout=10)
    waiter.join(timeout=10)
