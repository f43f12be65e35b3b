"""Policies with sane bounds: what `policy check` passes can always run.

Every generated document is either accepted, and then travels into a workflow input and
back unchanged, or refused with an error that names where; alias bombs, oversized files and
files of too many entries are refused before anything walks them, each naming its limit.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.contrib.pydantic import pydantic_data_converter

from autoclusters.core import yaml_spec
from autoclusters.core.models import IncidentRequest
from autoclusters.core.policy import (
    MAX_DURATION_S,
    MAX_POLICY_BYTES,
    MAX_POLICY_NODES,
    Policy,
    PolicyError,
    Rung,
    load_policy,
    parse_policy,
)

ALIAS_BOMB = """\
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_an_alias_bomb_is_refused_at_once() -> None:
    assert len(ALIAS_BOMB.encode()) <= 400
    started = time.process_time()
    with pytest.raises(PolicyError, match="aliases"):
        parse_policy(ALIAS_BOMB)
    assert time.process_time() - started < 1.0


def test_aliases_a_real_policy_uses_still_load() -> None:
    text = """\
steps:
  reboot: &careful {needs_approval: true, idle_timeout_s: 600}
  replace: *careful
"""
    policy = parse_policy(text)
    assert policy.steps[Rung.REPLACE].needs_approval


def test_a_policy_over_one_mebibyte_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("approvers:\n" + "  - alice\n" * (MAX_POLICY_BYTES // 10))
    with pytest.raises(PolicyError, match="at most 1048576 bytes"):
        load_policy(big)


def _never_composed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tree-building parse (seconds per megabyte) must not start."""

    def compose(*_: object) -> None:
        raise AssertionError("the full parse ran")

    monkeypatch.setattr(yaml.SafeLoader, "get_single_node", compose)


def test_a_one_megabyte_policy_of_too_many_entries_is_refused_at_once_naming_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No alias in it: it used to take seconds and blame aliases.
    big = tmp_path / "policy.yaml"
    big.write_text("approvers:\n" + "  - alice\n" * 100_000)
    assert 1_000_000 <= big.stat().st_size <= MAX_POLICY_BYTES
    _never_composed(monkeypatch)
    started = time.perf_counter()
    with pytest.raises(PolicyError) as e:
        load_policy(big)
    assert time.perf_counter() - started < 0.5  # the bound; it takes ~0.05 s
    (problem,) = e.value.problems
    assert f"more than {MAX_POLICY_NODES} entries" in problem.message
    assert f"at most {MAX_POLICY_NODES}" in problem.message
    assert "alias" not in problem.message


def test_a_policy_one_byte_over_the_size_limit_is_refused_unread_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "policy.yaml"
    big.write_text("#" * MAX_POLICY_BYTES + "\n")
    _never_composed(monkeypatch)
    monkeypatch.setattr(yaml_spec, "count_entries", lambda *_: pytest.fail("the file was scanned"))
    started = time.perf_counter()
    with pytest.raises(PolicyError) as e:
        load_policy(big)
    assert time.perf_counter() - started < 0.5
    assert str(e.value) == (
        f"{big}: the file is {MAX_POLICY_BYTES + 1} bytes; "
        f"a policy may be at most {MAX_POLICY_BYTES} bytes"
    )


@pytest.mark.parametrize("fast", [True, False])
def test_entries_are_counted_up_to_just_past_the_limit(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fast:  # PyYAML built without libyaml: the same count, slower
        monkeypatch.setattr(yaml_spec, "_FastLoader", yaml.SafeLoader)
    # the mapping, its 2 keys, the sequence and its 3 items, the alias: 8
    text = "a: &x [1, 2, 3]\nb: *x\n"
    assert yaml_spec.count_entries(text, 100) == 8
    assert yaml_spec.count_entries("- x\n" * 1000, 10) == 11  # stops past the limit
    # What the parser cannot read is left to the full parse, which names the line.
    assert yaml_spec.count_entries("a: [1, 2\n", 100) < 100
    assert yaml_spec.count_entries("a: \ud800\n", 100) < 100
    with pytest.raises(PolicyError):
        parse_policy("approvers: [\ud800]\n")


def test_a_document_of_entries_just_under_the_limit_still_loads() -> None:
    names = "".join(f"  gpu-{i:05d}: {{leaf: l{i % 64}}}\n" for i in range(9_000))
    policy = parse_policy("topology:\n" + names)
    assert len(policy.topology) == 9_000


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("approval_timeout_s: .inf\n", "approval_timeout_s"),
        ("approval_timeout_s: .nan\n", "approval_timeout_s"),
        ("steps: {reboot: {idle_timeout_s: 1e300}}\n", "steps.reboot.idle_timeout_s"),
        ("recurrence_window_s: -1\n", "recurrence_window_s"),
        (f"guard: {{breaker_window_s: {MAX_DURATION_S + 1}}}\n", "guard.breaker_window_s"),
        ("guard: {max_concurrent_repairs: 100000000000000000000}\n", "guard"),
        ("max_repair_attempts: 1000\n", "max_repair_attempts"),
    ],
)
def test_unbounded_numbers_are_refused_with_their_field(text: str, field: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(text)
    assert any(p.field.startswith(field) for p in e.value.problems), e.value


def _round_trips(policy: Policy) -> None:
    req = IncidentRequest(
        incident_id="inc-fuzz",
        cluster="c",
        node="gpu-01",
        fault="XID_79",
        opened_at=datetime(2026, 1, 1, tzinfo=UTC),
        policy=policy,
    )
    converter = pydantic_data_converter.payload_converter
    (payload,) = converter.to_payloads([req])
    (back,) = converter.from_payloads([payload], [IncidentRequest])
    assert back == req


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["auto", "approve", "observe", "reboot", "replace", "XID_79", "gpu-01"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=12,
)
fields = st.sampled_from(
    [
        "mode", "approvers", "approval_timeout_s", "approval_timeout_action",
        "recurrence_window_s", "max_repair_attempts", "faults", "default_rule", "steps",
        "guard", "topology", "nonsense",
    ]
)  # fmt: skip
documents = st.dictionaries(fields, values, max_size=6)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_every_document_is_accepted_and_runs_or_refused_naming_where(doc: dict) -> None:
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        policy = parse_policy(text)
    except PolicyError as e:
        assert e.problems
        for p in e.problems:
            assert p.message
            assert p.field or p.line is not None, p
        return
    _round_trips(policy)
