"""The cluster spec: what loads, what is refused and where, and `cluster validate`.

Aspects covered:
- both examples load (the Crusoe one with its policy file, the sandbox one inline);
- each kind of mistake is refused with the line and dotted field it is at: names, provider,
  counts and sizes out of bounds, SSH keys malformed, duplicate node set / user names,
  reserved users, unknown fields (with a hint), an inline policy's own mistakes, a broken
  policy file (its own file and line), YAML syntax, duplicate keys, alias bombs;
- sizes read as Gi/Ti/Pi; node names per set;
- `cluster validate` prints problems one per line and exits 2, or one summary line and 0;
- a fuzz: every generated document is accepted and round-trips through a workflow payload,
  or is refused with problems that each name where.
"""

from __future__ import annotations

import base64
import struct
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.contrib.pydantic import pydantic_data_converter
from typer.testing import CliRunner

from autoclusters.clients.cli.app import app
from autoclusters.core.cluster_spec import (
    MAX_HOME_GIB,
    MAX_NODES,
    ClusterSpec,
    ClusterSpecError,
    load_cluster_spec,
    parse_cluster_spec,
    ssh_public_key,
)
from autoclusters.core.policy import Policy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICvYBsl/DgCvGh/DMo+nY6kmlyPI24+sT5OvcdsYbW6Q alice@x"

BASE = f"""\
name: demo
provider: sandbox
location: local
login:
  count: 1
  ssh_public_keys: ["{KEY}"]
node_sets:
  - name: gpu
    instance_type: h100-80gb-sxm-ib.8x
    count: 4
    partition: gpu
users:
  - name: alice
    ssh_public_keys: ["{KEY}"]
    slurm_account: research
"""


def _problems(text: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ClusterSpecError) as e:
        parse_cluster_spec(text, source="spec.yaml")
    return [(p.line, p.field, p.message) for p in e.value.problems]


def _where(text: str) -> list[tuple[int | None, str]]:
    return [(line, field) for line, field, _ in _problems(text)]


def test_the_examples_load() -> None:
    spec, policy = load_cluster_spec(EXAMPLES / "sandbox.yaml")
    assert spec.provider == "sandbox"
    assert spec.nodes() == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    assert isinstance(spec.policy, Policy) and policy is spec.policy
    assert policy.guard.max_concurrent_repairs == 1
    assert not spec.keep_on_failure
    crusoe, from_file = load_cluster_spec(EXAMPLES / "crusoe.yaml")
    assert crusoe.provider == "crusoe-managed-slurm" and crusoe.accounting
    assert crusoe.shared_home.size == 100 * 1024
    assert [s.name for s in crusoe.node_sets] == ["h100", "cpu"]
    assert crusoe.node_sets[0].ib_partition
    assert isinstance(crusoe.policy, str) and from_file.faults


def test_defaults() -> None:
    spec = parse_cluster_spec(BASE)
    assert spec.accounting is False and spec.keep_on_failure is False
    assert spec.policy is None
    assert spec.controller.slurm_version == "25.11"
    assert spec.node_sets[0].gpus_per_node == 8 and spec.node_sets[0].ib_partition is None
    assert spec.shared_home.size == 100


@pytest.mark.parametrize(
    ("size", "gib"), [("10Gi", 10), ("2Ti", 2048), ("1Pi", 1024 * 1024), (64, 64), ("5 Ti", 5120)]
)
def test_home_sizes(size: object, gib: int) -> None:
    spec = parse_cluster_spec(BASE + f"shared_home: {{size: {size}}}\n")
    assert spec.shared_home.size == gib


def test_node_names_are_zero_padded_per_set() -> None:
    text = BASE.replace("count: 4", "count: 120")
    assert parse_cluster_spec(text).nodes()[:2] == ["gpu-001", "gpu-002"]
    assert parse_cluster_spec(text).nodes()[-1] == "gpu-120"


@pytest.mark.parametrize(
    ("old", "new", "line", "field", "message"),
    [
        ("name: demo", "name: Demo_1", 1, "name", "not a valid cluster name"),
        ("name: demo", "name: " + "a" * 41, 1, "name", "at most 40"),
        ("provider: sandbox", "provider: aws", 2, "provider", "crusoe-cmk"),
        ("location: local", "location: US East", 3, "location", "not a valid location"),
        ("  count: 1\n", "  count: 17\n", 5, "login.count", "less than or equal to 16"),
        ("  count: 1\n", "  count: 0\n", 5, "login.count", "greater than or equal to 1"),
        ("    count: 4", "    count: 5000", 10, "node_sets[0].count", "4096"),
        ("    count: 4", "    count: -1", 10, "node_sets[0].count", "greater than"),
        ("    partition: gpu", "    partition: GPU", 11, "node_sets[0].partition", "partition"),
        ("name: gpu", "name: gpu-", 8, "node_sets[0].name", "not ending with '-'"),
        ("instance_type: h100", "instance_type: H100 big", 9, "node_sets[0].instance_type", ""),
        ("  - name: alice", "  - name: root", 13, "users[0]", "system user"),
        ("  - name: alice", "  - name: Alice!", 13, "users[0].name", "not a valid user name"),
        ("slurm_account: research", "slurm_account: 'a b'", 15, "users[0].slurm_account", ""),
        (
            "partition: gpu\n",
            "partition: gpu\n    gpu_per_node: 8\n",
            12,
            "node_sets[0].gpu_per_node",
            "did you",
        ),
    ],
)
def test_each_mistake_names_its_line_and_field(
    old: str, new: str, line: int, field: str, message: str
) -> None:
    assert old in BASE
    problems = _problems(BASE.replace(old, new, 1))
    assert any((pl, pf) == (line, field) and message in pm for pl, pf, pm in problems), problems


def test_gpus_and_home_are_bounded() -> None:
    text = BASE.replace("partition: gpu\n", "partition: gpu\n    gpus_per_node: 17\n")
    assert (12, "node_sets[0].gpus_per_node") in _where(text)
    assert (17, "shared_home.size") in _where(BASE + f"shared_home:\n  size: {MAX_HOME_GIB + 1}\n")
    assert (17, "shared_home.size") in _where(BASE + "shared_home:\n  size: 10Xi\n")


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("ssh-ed25519", "not an SSH public key"),
        ("ssh-dss AAAAB3NzaC1kc3M= x", "not an SSH public key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "not an SSH public key"),
        ("SHA256:abcdefghijklmnop", "not an SSH public key"),
        ("ssh-ed25519 not*base64", "not valid base64"),
        ("ssh-ed25519 AAAA", "truncated"),
        (
            "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAICvYBsl/DgCvGh/DMo+nY6kmlyPI24+sT5OvcdsYbW6Q",
            "is a ssh-ed25519 key, not ssh-rsa",
        ),
    ],
)
def test_ssh_keys_are_checked(key: str, message: str) -> None:
    text = BASE.replace(f'ssh_public_keys: ["{KEY}"]', f"ssh_public_keys: [{key!r}]", 1)
    problems = _problems(text)
    assert any(
        (pl, pf) == (6, "login.ssh_public_keys[0]") and message in pm for pl, pf, pm in problems
    ), problems


def test_valid_keys_of_each_kind_pass() -> None:
    for kind in ("ssh-rsa", "ecdsa-sha2-nistp256", "sk-ssh-ed25519@openssh.com"):
        blob = struct.pack(">I", len(kind)) + kind.encode() + b"\x00" * 40
        line = f"{kind} {base64.b64encode(blob).decode()} me@host"
        assert ssh_public_key(f"  {line}\n") == line


def test_a_user_needs_a_key() -> None:
    text = BASE.replace(f'    ssh_public_keys: ["{KEY}"]\n    slurm_account', "    slurm_account")
    assert (13, "users[0].ssh_public_keys") in _where(text)


def test_duplicate_names_are_refused_where_the_second_is() -> None:
    text = BASE.replace(
        "users:",
        "  - name: gpu\n    instance_type: x.8x\n    count: 1\n    partition: gpu\nusers:",
    )
    text += f'  - name: alice\n    ssh_public_keys: ["{KEY}"]\n    slurm_account: other\n'
    problems = _problems(text)
    assert (12, "node_sets[1].name") in [(p[0], p[1]) for p in problems]
    assert (20, "users[1].name") in [(p[0], p[1]) for p in problems]
    assert all("already used by" in p[2] for p in problems)


def test_too_many_nodes_in_all() -> None:
    sets = "".join(
        f"  - {{name: s{i}, instance_type: x.8x, count: 4096, partition: gpu}}\n" for i in range(5)
    )
    text = "name: big\nprovider: crusoe-cmk\nlocation: us-east1-a\nnode_sets:\n" + sets
    problems = _problems(text)
    assert [(p[0], p[1]) for p in problems] == [(4, "node_sets")]
    assert str(MAX_NODES) in problems[0][2]


def test_an_inline_policy_is_validated_in_place() -> None:
    text = BASE + "policy:\n  mode: yolo\n  guard: {max_concurent_repairs: 2}\n"
    problems = _problems(text)
    assert (17, "policy.mode") in [(p[0], p[1]) for p in problems]
    assert any(
        p[1] == "policy.guard.max_concurent_repairs" and "max_concurrent_repairs" in p[2]
        for p in problems
    ), problems


def test_a_policy_file_is_read_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "policy.yaml").write_text("mode: approve\napprovers: [bob]\n")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(BASE + "policy: p/policy.yaml\n")
    spec, policy = load_cluster_spec(spec_file)
    assert spec.policy == "p/policy.yaml" and policy.mode == "approve"


def test_a_broken_policy_file_is_reported_in_its_own_file(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("mode: auto\nmax_repair_attempts: 1000\n")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(BASE + "policy: policy.yaml\n")
    with pytest.raises(ClusterSpecError) as e:
        load_cluster_spec(spec_file)
    lines = str(e.value).splitlines()
    assert lines[0].startswith(f"{spec_file}:16: policy: the policy file")
    assert lines[1].startswith(f"{tmp_path / 'policy.yaml'}:2: max_repair_attempts: ")
    missing = tmp_path / "spec2.yaml"
    missing.write_text(BASE + "policy: nowhere.yaml\n")
    with pytest.raises(ClusterSpecError, match="cannot read"):
        load_cluster_spec(missing)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("", 1, "empty"),
        ("- a\n- b\n", 1, "must be a mapping"),
        ("name: [a\n", 2, "YAML syntax error"),
        (BASE + "name: again\n", 16, "duplicate key (first given on line 1)"),
    ],
)
def test_files_that_are_not_specs(text: str, line: int, message: str) -> None:
    problems = _problems(text)
    assert any(pl == line and message in pm for pl, _, pm in problems), problems


def test_an_alias_bomb_is_refused_at_once() -> None:
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    started = time.process_time()
    with pytest.raises(ClusterSpecError, match="aliases"):
        parse_cluster_spec(bomb)
    assert time.process_time() - started < 1.0


def test_an_oversized_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(BASE + "#" * (300 * 1024) + "\n")
    with pytest.raises(ClusterSpecError, match="a cluster spec may be at most"):
        load_cluster_spec(big)


# --- the CLI --------------------------------------------------------------------------------


def test_validate_prints_one_summary_line() -> None:
    result = CliRunner().invoke(app, ["cluster", "validate", str(EXAMPLES / "crusoe.yaml")])
    assert result.exit_code == 0, result.output
    (line,) = result.output.strip().splitlines()
    assert "OK: cluster llm-train on crusoe-managed-slurm" in line
    assert "36 nodes" in line and "accounting on" in line


def test_validate_prints_each_problem_and_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(BASE.replace("name: demo", "name: Demo").replace("count: 4", "count: 0"))
    result = CliRunner().invoke(app, ["cluster", "validate", str(spec)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"{spec}:1: name: 'Demo' is not a valid cluster name: lower-case letters, digits and "
        "'-', starting with a letter, not ending with '-', at most 40 characters",
        f"{spec}:10: node_sets[0].count: Input should be greater than or equal to 1",
    ]


# --- the fuzz -------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["sandbox", "crusoe-cmk", "gpu", "local", "10Ti", "x.8x", KEY]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(["name", "count", "size", "partition", "mode", "x"])
            | st.text(max_size=6),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)
node_set = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["gpu", "cpu", "GPU", "a-", "gpu"]),
        "instance_type": st.sampled_from(["x.8x", "bad type"]),
        "count": st.integers(min_value=-1, max_value=5000),
        "partition": st.sampled_from(["gpu", "p_1"]),
    },
    optional={"gpus_per_node": st.integers(-1, 20), "ib_partition": scalars, "junk": scalars},
)
documents = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["demo", "x" * 41, "Demo"]) | st.text(max_size=8),
        "provider": st.sampled_from(["sandbox", "crusoe-managed-slurm", "aws"]),
        "location": st.sampled_from(["local", "us-east1-a"]) | scalars,
        "node_sets": st.lists(node_set, max_size=3) | values,
    },
    optional={
        "login": values,
        "shared_home": st.fixed_dictionaries({"size": scalars}) | values,
        "users": values,
        "policy": values,
        "accounting": scalars,
        "keep_on_failure": scalars,
        "controller": values,
        "nonsense": values,
    },
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_every_document_is_accepted_and_travels_or_refused_naming_where(doc: dict) -> None:
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        spec = parse_cluster_spec(text)
    except ClusterSpecError as e:
        assert e.problems
        for p in e.problems:
            assert p.message
            assert p.field or p.line is not None, p
        return
    converter = pydantic_data_converter.payload_converter
    (payload,) = converter.to_payloads([spec])
    (back,) = converter.from_payloads([payload], [ClusterSpec])
    assert back == spec
    assert len(spec.nodes()) == len(set(spec.nodes())) <= MAX_NODES
