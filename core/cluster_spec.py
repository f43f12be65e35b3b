"""The cluster spec: what `ClusterProvisioning` builds, in one YAML file.

A spec names the cluster, its provider (`sandbox`: the local emulators;
`crusoe-managed-slurm`: Crusoe's Managed Slurm REST API; `crusoe-cmk`: Slinky on a CMK
cluster), where it runs, its controller (and accounting database), login nodes, shared
/home, node sets, users, and the remediation policy the cluster is handed over to. It is
validated at load with errors that name the line and field (core/yaml_spec.py), and every
count and size is bounded, so a spec that loads can always travel in a workflow input.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from autoclusters.core.policy import Policy, PolicyError, load_policy
from autoclusters.core.yaml_spec import (
    SpecError,
    SpecFormat,
    SpecProblem,
    load_yaml_model,
    node_at,
    parse_yaml,
    validate_node,
)

Provider = Literal["sandbox", "crusoe-managed-slurm", "crusoe-cmk"]

MAX_SPEC_BYTES = 256 * 1024
MAX_SPEC_NODES = 50_000
MAX_NODE_SETS = 64
MAX_NODES_PER_SET = 4096
MAX_NODES = 16_384  # all node sets together
MAX_LOGIN_NODES = 16
MAX_GPUS_PER_NODE = 16
MAX_USERS = 1024
MAX_KEYS = 32  # SSH keys per user, or on the login nodes
MAX_HOME_GIB = 1024 * 1024  # 1 PiB
MAX_MACHINE_ATTEMPTS = 10

# A DNS-1123 label (Kubernetes object names) that is also a valid Slurm name. The cluster's
# name prefixes its objects (`<name>-controller-0`), a node set's its nodes (`gpu-0001`),
# so both leave room under the 63 characters of a label.
_LABEL = r"[a-z]([-a-z0-9]*[a-z0-9])?"
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_ACCOUNT = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,63}")
_INSTANCE_TYPE = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")
_LOCATION = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_PARTITION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_SIZE = re.compile(r"(\d{1,7})\s*(Gi|Ti|Pi)")
RESERVED_USERS = frozenset({"root", "slurm", "munge", "daemon", "nobody", "bin", "sys"})

SSH_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
MAX_SSH_KEY_CHARS = 16 * 1024


def _label(max_len: int, what: str) -> Any:
    pattern = re.compile(_LABEL)

    def check(v: str) -> str:
        if len(v) <= max_len and pattern.fullmatch(v):
            return v
        raise PydanticCustomError(
            "name",
            "{value} is not a valid {what}: lower-case letters, digits and '-', starting "
            "with a letter, not ending with '-', at most {max} characters",
            {"value": repr(v)[:80], "what": what, "max": max_len},
        )

    return AfterValidator(check)


def _matching(pattern: re.Pattern[str], what: str) -> Any:
    def check(v: str) -> str:
        if pattern.fullmatch(v):
            return v
        raise PydanticCustomError(
            "format", "{value} is not a valid {what}", {"value": repr(v)[:80], "what": what}
        )

    return AfterValidator(check)


def ssh_public_key(v: str) -> str:
    """One OpenSSH public key line: `<type> <base64 blob> [comment]`, the blob naming its type."""
    line = v.strip()
    if len(line) > MAX_SSH_KEY_CHARS or "\n" in line:
        raise PydanticCustomError("ssh_key", "an SSH public key is one line of at most 16 KiB", {})
    parts = line.split(None, 2)
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        raise PydanticCustomError(
            "ssh_key",
            "not an SSH public key: expected '<type> <base64> [comment]' with type one of "
            "{types} (a private key or a fingerprint does not belong here)",
            {"types": ", ".join(sorted(SSH_KEY_TYPES))},
        )
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise PydanticCustomError("ssh_key", "the SSH key's body is not valid base64", {}) from None
    size = struct.unpack(">I", blob[:4])[0] if len(blob) >= 4 else -1
    declared = blob[4 : 4 + size] if 0 < size <= 64 and len(blob) >= 4 + size else None
    if declared is None or len(blob) == 4 + size:
        raise PydanticCustomError("ssh_key", "the SSH key's body is truncated or not a key", {})
    if declared != parts[0].encode():
        raise PydanticCustomError(
            "ssh_key",
            "the SSH key's body is a {declared} key, not {kind}",
            {"declared": declared.decode("ascii", "replace")[:64], "kind": parts[0]},
        )
    return line


ClusterName = Annotated[str, _label(40, "cluster name")]
NodeSetName = Annotated[str, _label(30, "node set name")]
PartitionName = Annotated[str, _label(40, "partition name")]
InstanceType = Annotated[str, _matching(_INSTANCE_TYPE, "instance type")]
Location = Annotated[str, _matching(_LOCATION, "location")]
UserName = Annotated[str, _matching(_USER, "user name")]
AccountName = Annotated[str, _matching(_ACCOUNT, "Slurm account name")]
PartitionId = Annotated[str, _matching(_PARTITION_ID, "InfiniBand partition id")]
SshKey = Annotated[str, AfterValidator(ssh_public_key)]
SshKeys = Annotated[list[SshKey], Field(max_length=MAX_KEYS)]


def _size_gib(v: Any) -> Any:
    if isinstance(v, str):
        m = _SIZE.fullmatch(v.strip())
        if m is None:
            raise PydanticCustomError(
                "size", "{value} is not a size: write e.g. 100Gi or 10Ti", {"value": repr(v)[:80]}
            )
        return int(m.group(1)) * {"Gi": 1, "Ti": 1024, "Pi": 1024 * 1024}[m.group(2)]
    return v


class _Strict(BaseModel):
    # A typo in a spec must fail the load, not silently fall back to a default.
    model_config = ConfigDict(extra="forbid")


class ControllerSpec(_Strict):
    instance_type: InstanceType | None = None  # None: the provider's default
    slurm_version: Annotated[str, _matching(re.compile(r"\d{2}\.\d{2}(\.\d+)?"), "version")] = (
        "25.11"
    )


class LoginSpec(_Strict):
    count: int = Field(default=1, ge=1, le=MAX_LOGIN_NODES)
    instance_type: InstanceType | None = None
    # Root's keys on the login nodes (Crusoe: `root_ssh_pub_keys`).
    ssh_public_keys: SshKeys = Field(default_factory=list)


class SharedHomeSpec(_Strict):
    # GiB: `100Gi`, `10Ti` (as Crusoe's `home_volume_size`) or a number of GiB.
    size: Annotated[int, BeforeValidator(_size_gib), Field(ge=1, le=MAX_HOME_GIB)] = 100


class NodeSetSpec(_Strict):
    name: NodeSetName
    instance_type: InstanceType
    count: int = Field(ge=1, le=MAX_NODES_PER_SET)
    partition: PartitionName
    gpus_per_node: int = Field(default=8, ge=0, le=MAX_GPUS_PER_NODE)
    ib_partition: PartitionId | None = None  # Crusoe `transport_partition_id`

    def node_names(self) -> list[str]:
        """The Slurm node names of the set's machines: `<set>-01`, ... (a replacement keeps
        its slot's name)."""
        width = max(2, len(str(self.count)))
        return [f"{self.name}-{i:0{width}d}" for i in range(1, self.count + 1)]


class UserSpec(_Strict):
    name: UserName
    ssh_public_keys: SshKeys = Field(min_length=1)
    slurm_account: AccountName

    @model_validator(mode="after")
    def _not_reserved(self) -> UserSpec:
        if self.name in RESERVED_USERS:
            raise PydanticCustomError(
                "reserved", "{name} is a system user; pick another name", {"name": self.name}
            )
        return self


def _policy_branch(v: Any) -> str:
    return "<file>" if isinstance(v, str) else "<inline>"


# `policy: path/to/policy.yaml` (relative to the spec) or `policy: {mode: ..., ...}`.
PolicyRef = Annotated[
    Annotated[str, Field(min_length=1, max_length=4096), Tag("<file>")]
    | Annotated[Policy, Tag("<inline>")],
    Discriminator(_policy_branch),
]


class ClusterSpec(_Strict):
    name: ClusterName
    provider: Provider
    location: Location
    controller: ControllerSpec = Field(default_factory=ControllerSpec)
    accounting: bool = False  # slurmdbd (and its database); Crusoe: off unless asked
    login: LoginSpec = Field(default_factory=LoginSpec)
    shared_home: SharedHomeSpec = Field(default_factory=SharedHomeSpec)
    node_sets: list[NodeSetSpec] = Field(min_length=1, max_length=MAX_NODE_SETS)
    users: list[UserSpec] = Field(default_factory=list, max_length=MAX_USERS)
    # None: the policy shipped with AutoClusters.
    policy: PolicyRef | None = None
    # On a failure, keep what was created (for a post-mortem) instead of deleting it.
    keep_on_failure: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        errors = _duplicates(self.node_sets, "node_sets", "node set")
        errors += _duplicates(self.users, "users", "user")
        total = sum(s.count for s in self.node_sets)
        if total > MAX_NODES:
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError(
                        "too_many_nodes",
                        "the node sets add up to {total} nodes; a cluster may have at most {max}",
                        {"total": total, "max": MAX_NODES},
                    ),
                    loc=("node_sets",),
                    input=total,
                )
            )
        if errors:
            # Raised with each problem's own place, so the file's line is the name's line.
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    def nodes(self) -> list[str]:
        return [n for s in self.node_sets for n in s.node_names()]


def _duplicates(items: list[Any], field: str, what: str) -> list[InitErrorDetails]:
    seen: dict[str, int] = {}
    errors: list[InitErrorDetails] = []
    for i, item in enumerate(items):
        if item.name in seen:
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError(
                        "duplicate",
                        "{what} name {name} is already used by {field}[{first}]",
                        {
                            "field": field,
                            "what": what,
                            "name": repr(item.name),
                            "first": seen[item.name],
                        },
                    ),
                    loc=(field, i, "name"),
                    input=item.name,
                )
            )
        else:
            seen[item.name] = i
    return errors


class ClusterSpecError(SpecError):
    """A cluster spec that cannot be used; the message lists every problem, one per line."""


SPEC_FORMAT = SpecFormat(
    model=ClusterSpec,
    error=ClusterSpecError,
    what="a cluster spec",
    max_bytes=MAX_SPEC_BYTES,
    max_nodes=MAX_SPEC_NODES,
    root_message="a cluster spec must be a mapping of fields (name, provider, node_sets, ...)",
)


def parse_cluster_spec(text: str, source: str = "<cluster spec>") -> ClusterSpec:
    """Validate a spec held in memory (a `policy:` file is not read: see resolve_policy)."""
    root, data = parse_yaml(text, source, SPEC_FORMAT)
    return validate_node(root, data, source, SPEC_FORMAT)


def load_cluster_spec(path: Path | str) -> tuple[ClusterSpec, Policy]:
    """Read and validate a spec and the policy it attaches (a file named relative to the
    spec); ClusterSpecError lists every problem of both with its file, line and field."""
    path = Path(path)
    spec = load_yaml_model(path, SPEC_FORMAT)
    return spec, resolve_policy(spec, path)


def resolve_policy(spec: ClusterSpec, spec_path: Path) -> Policy:
    if isinstance(spec.policy, Policy):
        return spec.policy
    if spec.policy is None:
        from autoclusters.core.policy import default_policy

        return default_policy()
    policy_path = Path(spec.policy)
    if not policy_path.is_absolute():
        policy_path = spec_path.parent / policy_path
    try:
        return load_policy(policy_path)
    except PolicyError as e:
        line = _policy_line(spec_path)
        first = SpecProblem(line, "policy", f"the policy file {str(policy_path)!r} is invalid")
        rest = [
            SpecProblem(p.line, p.field, p.message, source=p.source or e.path) for p in e.problems
        ]
        raise ClusterSpecError(spec_path, [first, *rest]) from None


def _policy_line(spec_path: Path) -> int | None:
    try:
        root, _ = parse_yaml(spec_path.read_text(encoding="utf-8"), str(spec_path), SPEC_FORMAT)
    except (OSError, SpecError):
        return None
    return node_at(root, ("policy",))[0]
