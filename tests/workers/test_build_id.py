"""The worker's build ID (workers/build_id.py): the same code gives the same ID, a changed
source of a loaded `autoclusters` module a new one."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from autoclusters.workers.build_id import code_build_id


def test_the_same_code_gives_the_same_id() -> None:
    assert code_build_id() == code_build_id()


def test_a_changed_module_source_gives_a_new_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "probe.py"
    source.write_text("STEP = 1\n")
    probe = types.ModuleType("autoclusters._build_id_probe")
    probe.__file__ = str(source)
    before = code_build_id()
    monkeypatch.setitem(sys.modules, probe.__name__, probe)
    loaded = code_build_id()
    source.write_text("STEP = 2\n")
    changed = code_build_id()
    assert len({before, loaded, changed}) == 3


def test_modules_outside_the_project_are_not_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    before = code_build_id()
    other = types.ModuleType("not_autoclusters_probe")
    other.__file__ = __file__
    monkeypatch.setitem(sys.modules, other.__name__, other)
    assert code_build_id() == before
