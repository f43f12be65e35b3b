"""The remediation policy: which fault gets which action, what needs a human, how fast.

One YAML file per cluster (path configurable); validated at load with errors that name the
line and field. Every incident carries a snapshot of the policy it was opened under, so a
policy edit never changes an incident mid-flight and the workflow stays deterministic.
"""

from __future__ import annotations

import difflib
import importlib.resources
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from autoclusters.core.faults import FAULT_PATTERN, NODE_PATTERN


class Rung(StrEnum):
    """The escalation ladder, cheapest first."""

    MONITOR = "monitor"  # record and notify; the node stays in service
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    REPLACE = "replace"


LADDER: list[Rung] = [Rung.MONITOR, Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE]

Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}
Mode = Literal["observe", "approve", "auto"]


def next_rung(rung: Rung) -> Rung | None:
    i = LADDER.index(rung)
    return LADDER[i + 1] if i + 1 < len(LADDER) else None


def _fault_kind(v: str) -> str:
    if FAULT_PATTERN.match(v):
        return v
    hint = ""
    if m := re.fullmatch(r"xid[_-]?(\d{1,3})", v.strip(), re.IGNORECASE):
        hint = f"; did you mean 'XID_{m.group(1)}'?"
    elif FAULT_PATTERN.match(v.strip().upper().replace("-", "_")):
        hint = f"; did you mean {v.strip().upper().replace('-', '_')!r}?"
    raise PydanticCustomError(
        "fault_kind",
        "{kind} is not a fault kind: write XID_<n> or an upper-case name such as "
        "GPU_FELL_OFF_BUS{hint}",
        {"kind": repr(v), "hint": hint},
    )


def _node_name(v: str) -> str:
    if NODE_PATTERN.match(v):
        return v
    raise PydanticCustomError(
        "node_name", "{node} is not a single Slurm node name", {"node": repr(v)}
    )


# Bounds that keep every policy usable: each duration finite and at most a week, each count
# small enough to mean something, so a policy that loads can always be encoded into a
# workflow input and never overflows inside one.
MAX_DURATION_S = 7 * 86400
MAX_COUNT = 100_000  # nodes, repairs, incidents: no cluster is larger
MAX_POLICY_BYTES = 1024 * 1024
# Nodes of the YAML document once aliases are expanded: a real policy has a few hundred.
MAX_POLICY_NODES = 50_000


def Duration(default: float) -> Any:  # noqa: N802 - reads as a type in the models below
    """Seconds: positive, finite, at most MAX_DURATION_S."""
    return Field(default=default, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)


def Count(default: int, *, ge: int = 1, le: int = MAX_COUNT) -> Any:  # noqa: N802
    return Field(default=default, ge=ge, le=le)


FaultKind = Annotated[str, AfterValidator(_fault_kind)]
NodeName = Annotated[str, AfterValidator(_node_name)]
Approver = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]


class _Strict(BaseModel):
    # A typo in a policy file must fail the load, not silently fall back to a default.
    model_config = ConfigDict(extra="forbid")


class FaultRule(_Strict):
    severity: Severity
    first_rung: Rung


class StepPolicy(_Strict):
    """How one repair rung is carried out."""

    needs_approval: bool = False
    # Never repair under a running job unless `force`: wait until the node is idle.
    wait_for_idle: bool = True
    idle_timeout_s: float = Duration(3600)
    # When the node is still busy after idle_timeout_s: cancel its jobs and go on (force),
    # or stop here, leave the node drained and page a human.
    on_idle_timeout: Literal["force", "leave_drained"] = "leave_drained"


class GuardPolicy(_Strict):
    """Blast-radius limits, enforced by the cluster's fleet guard."""

    max_concurrent_repairs: int = Count(2)
    min_in_service_fraction: float = Field(default=0.75, ge=0, le=1, allow_inf_nan=False)
    # Trips on more than K opens within the sliding window, K = the larger of
    # breaker_threshold (the floor) and breaker_threshold_fraction of the cluster's nodes.
    breaker_threshold: int = Count(5)
    breaker_threshold_fraction: float = Field(default=0.05, ge=0, le=1, allow_inf_nan=False)
    breaker_window_s: float = Duration(600)
    # While incidents wait or nodes are left drained, the guard re-reads Slurm this often
    # (a node a human resumed is in service again).
    reconcile_interval_s: float = Duration(300)
    # A critical fault whose quarantine is held: drain the node without requeueing (its
    # running jobs go on, it takes no new ones) until the guard admits the quarantine.
    drain_held_critical: bool = True
    # Hot spares: healthy nodes kept drained ("autoclusters: spare") out of the partition. A
    # replacement puts one into service at once; the replaced node, once healthy, becomes
    # the spare.
    spares: list[Annotated[str, AfterValidator(_node_name)]] = Field(
        default_factory=list, max_length=1024
    )

    def breaker_limit(self, cluster_nodes: int) -> int:
        """K: the breaker trips on more than K opens within the window."""
        return max(
            self.breaker_threshold, math.floor(self.breaker_threshold_fraction * cluster_nodes)
        )


class NodeTopology(_Strict):
    leaf: str | None = Field(default=None, max_length=256)  # InfiniBand leaf switch
    pod: str | None = Field(default=None, max_length=256)  # scalable unit / pod


class Policy(_Strict):
    mode: Mode = "auto"
    approvers: list[Approver] = Field(default_factory=list, max_length=1024)
    approval_timeout_s: float = Duration(3600)
    # After the timeout and one reminder: leave the node drained and page (default), or go on.
    approval_timeout_action: Literal["leave_drained", "proceed"] = "leave_drained"
    recurrence_window_s: float = Duration(86400)
    max_repair_attempts: int = Count(3, le=len(LADDER) * 3)
    # The health gate waits this long after a repair for the node agent's fresh report.
    agent_report_timeout_s: float = Field(default=300, gt=0, le=3600)
    faults: dict[FaultKind, FaultRule] = Field(default_factory=dict)
    default_rule: FaultRule = FaultRule(severity="warning", first_rung=Rung.REBOOT)
    steps: dict[Rung, StepPolicy] = Field(default_factory=dict)
    guard: GuardPolicy = Field(default_factory=GuardPolicy)
    topology: dict[NodeName, NodeTopology] = Field(default_factory=dict, max_length=MAX_COUNT)

    def rule_for(self, fault: str) -> FaultRule:
        return self.faults.get(fault, self.default_rule)

    def step(self, rung: Rung) -> StepPolicy:
        return self.steps.get(rung, StepPolicy())

    def rung_for(self, fault: str, recent_incidents: int) -> Rung:
        """The fault's first rung, one up per earlier incident on the node in the window."""
        rung = self.rule_for(fault).first_rung
        if rung == Rung.MONITOR:
            return rung
        for _ in range(recent_incidents):
            rung = next_rung(rung) or rung
        return rung


# --- loading from YAML -------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyProblem:
    """One thing wrong with a policy file: where (1-based line, dotted field) and what."""

    line: int | None
    field: str
    message: str


class PolicyError(ValueError):
    """A policy file that cannot be used; the message lists every problem, one per line."""

    def __init__(self, path: Path | str, problems: list[PolicyProblem]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__("\n".join(_format(self.path, p) for p in problems))


def _format(path: str, p: PolicyProblem) -> str:
    where = f"{path}:{p.line}" if p.line is not None else path
    return f"{where}: {p.field}: {p.message}" if p.field else f"{where}: {p.message}"


DEFAULT_POLICY_FILE = "policies/default.yaml"


def default_policy() -> Policy:
    """The policy shipped with AutoClusters (core/policies/default.yaml)."""
    resource = importlib.resources.files("autoclusters.core").joinpath(DEFAULT_POLICY_FILE)
    with importlib.resources.as_file(resource) as path:
        return load_policy(path)


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file; PolicyError names the line and field of each problem."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_POLICY_BYTES:
            raise PolicyError(path, [_too_large(size)])
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(path, [PolicyProblem(None, "", f"cannot read: {e}")]) from None
    return parse_policy(text, source=str(path))


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML held in memory; `source` names it in errors."""
    if len(text.encode("utf-8", errors="replace")) > MAX_POLICY_BYTES:
        raise PolicyError(source, [_too_large(len(text.encode("utf-8", errors="replace")))])
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise PolicyError(source, [PolicyProblem(1, "", "the file is empty")])
        # Aliases share nodes: a few hundred bytes can name billions of them. Count the
        # expanded size first, in time linear in the file, before anything walks the tree.
        expanded = _expanded_size(root)
        if expanded > MAX_POLICY_NODES:
            raise PolicyError(
                source,
                [
                    PolicyProblem(
                        None,
                        "",
                        f"the document expands to more than {MAX_POLICY_NODES} values "
                        "(YAML aliases repeated too often)",
                    )
                ],
            )
        # Checked on the pristine tree: constructing it flattens `<<` merges in place.
        dups = _duplicate_keys(root, ())
        if dups:
            raise PolicyError(source, dups)
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as e:
        raise PolicyError(source, [_syntax_problem(e)]) from None
    except yaml.YAMLError as e:
        raise PolicyError(source, [PolicyProblem(None, "", f"YAML error: {e}")]) from None
    except RecursionError:
        raise PolicyError(source, [PolicyProblem(None, "", "nested too deeply")]) from None
    finally:
        loader.dispose()
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise PolicyError(source, [_problem(root, err) for err in e.errors()]) from None


def _too_large(size: int) -> PolicyProblem:
    return PolicyProblem(
        None, "", f"the file is {size} bytes; a policy may be at most {MAX_POLICY_BYTES} bytes"
    )


def _expanded_size(root: yaml.Node) -> int:
    """Values the document holds once every alias is expanded, stopping once it is too many.

    Each distinct node's size is computed once (aliases point at the same node object), so
    this is linear in the file however deeply aliases nest; a cycle counts as too many.
    """
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    cap = MAX_POLICY_NODES + 1

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in visiting:
            return cap
        visiting.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                total += size(k) + size(v)
                if total >= cap:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
                if total >= cap:
                    break
        visiting.discard(key)
        sizes[key] = min(total, cap)
        return sizes[key]

    return size(root)


def _syntax_problem(e: yaml.MarkedYAMLError) -> PolicyProblem:
    mark = e.problem_mark or e.context_mark
    what = e.problem or e.context or "invalid YAML"
    if e.context and e.problem:
        # e.g. "expected ',' or '}', but got ':' (while parsing a flow mapping, line 3)"
        started = e.context_mark
        if started is not None and mark is not None and started.line != mark.line:
            what += f" ({e.context}, line {started.line + 1})"
        else:
            what += f" ({e.context})"
    return PolicyProblem(mark.line + 1 if mark else None, "", f"YAML syntax error: {what}")


def _duplicate_keys(node: yaml.Node, path: tuple[str, ...]) -> list[PolicyProblem]:
    """PyYAML keeps the last of two equal keys without a word; a policy file must not."""
    problems: list[PolicyProblem] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            if key.value in seen:
                problems.append(
                    PolicyProblem(
                        line,
                        _dotted((*path, key.value)),
                        f"duplicate key (first given on line {seen[key.value]})",
                    )
                )
            else:
                seen[key.value] = line
            problems += _duplicate_keys(value, (*path, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems += _duplicate_keys(item, (*path, f"[{i}]"))
    return problems


def _dotted(parts: tuple[str, ...]) -> str:
    out = ""
    for p in parts:
        out += p if p.startswith("[") or not out else f".{p}"
    return out


def _problem(root: yaml.Node, err: Any) -> PolicyProblem:
    """Map one pydantic error onto the YAML node it is about, by walking `loc` down the tree."""
    loc: tuple[int | str, ...] = tuple(err["loc"])
    node: yaml.Node | None = root
    line = root.start_mark.line + 1
    parts: list[str] = []
    for i, part in enumerate(loc):
        if part == "[key]":
            break
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            parts.append(f"[{part}]")
            node = node.value[part] if 0 <= part < len(node.value) else None
            if node is not None:
                line = node.start_mark.line + 1
            continue
        parts.append(str(part))
        pair = _find_key(node, part) if isinstance(node, yaml.MappingNode) else None
        if pair is None:
            node = None  # a missing field: keep the line of the nearest enclosing node
            continue
        key, value = pair
        # A wrong key, or a nested block, is reported where its key is written.
        is_key_error = loc[i + 1 : i + 2] == ("[key]",)
        scalar = isinstance(value, yaml.ScalarNode)
        line = (value if scalar and not is_key_error else key).start_mark.line + 1
        node = value
    field = _dotted(tuple(parts))
    message = str(err["msg"])
    if err["type"] == "extra_forbidden":
        message = _unknown_field_message(loc)
    elif err["type"] == "missing":
        message = "required field is missing"
    elif err["type"] == "model_type" and not loc:
        message = "a policy file must be a mapping of policy fields (mode, faults, steps, ...)"
    return PolicyProblem(line, field, message)


def _find_key(node: yaml.MappingNode, part: int | str) -> tuple[yaml.Node, yaml.Node] | None:
    # The last match wins, as it does when the YAML is constructed (and after `<<` merges).
    for key, value in reversed(node.value):
        if isinstance(key, yaml.ScalarNode) and key.value == str(part):
            return key, value
    return None


def _unknown_field_message(loc: tuple[int | str, ...]) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return "unknown field"
    known = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    return f"unknown field; expected one of: {', '.join(known)}"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The policy model class that the value at `loc` is validated as."""
    model: type[BaseModel] = Policy
    parts = list(loc)
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        if field is None:
            return None
        ann = field.annotation
        if get_origin(ann) is dict:
            if not parts:
                return None
            parts.pop(0)
            ann = get_args(ann)[1]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model
