"""The activity stubs the workflows call (activities/contracts.py) and the implementations the
worker registers agree: every stub has one implementation under its name, taking and
returning the same types (a mismatch would only show at run time, as a failed
deserialisation in the middle of an incident)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing
from typing import Any

from temporalio import activity

import autoclusters.activities as activities_pkg
from autoclusters.activities import contracts


def _signature(fn: Any) -> tuple[Any, Any]:
    hints = typing.get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    assert len(params) == 1, f"{fn.__qualname__}: one input model, not {params}"
    return hints[params[0]], hints["return"]


def _name(fn: Any) -> str | None:
    defn = activity._Definition.from_callable(fn)  # noqa: SLF001 - the name it registers under
    return defn.name if defn else None


def _implementations() -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for mod in pkgutil.iter_modules(activities_pkg.__path__):
        if mod.name == "contracts":
            continue
        module = importlib.import_module(f"autoclusters.activities.{mod.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for attr, fn in vars(cls).items():
                if callable(fn) and (name := _name(fn)) is not None:
                    found.setdefault(name, []).append((cls, attr, fn))
    return found


def test_every_stub_has_one_implementation_with_the_same_types() -> None:
    impls = _implementations()
    stubs = {
        _name(fn): fn
        for _, fn in inspect.getmembers(contracts, inspect.isfunction)
        if fn.__module__ == contracts.__name__ and _name(fn) is not None
    }
    assert len(stubs) > 40
    for name, stub in stubs.items():
        assert name in impls, f"stub {name} has no implementation"
        for cls, attr, fn in impls[name]:
            assert _signature(fn) == _signature(stub), f"{cls.__name__}.{attr} vs stub {name}"


def test_every_sharing_step_has_a_stub() -> None:
    names = {_name(fn) for _, fn in inspect.getmembers(contracts, inspect.isfunction)}
    assert {
        "share_read_demand", "share_drain_for_move", "share_checkpoint_jobs", "share_mark_lent",
        "share_resume_training", "share_regrow_jobs", "share_k8s_lend", "share_scale_inference",
        "share_wait_serving", "share_k8s_release", "share_k8s_reclaim", "share_yield_node",
    } <= names  # fmt: skip
