"""What a fault kind, a node name and an incident id may look like, wherever they come from,
and which fault kinds AutoClusters knows."""

from __future__ import annotations

import re
from collections.abc import Iterable

# XID_<n> from the driver, or a named fault such as GPU_FELL_OFF_BUS / IB_LINK_DOWN / MANUAL.
FAULT_PATTERN = re.compile(r"^(XID_\d{1,3}|(?!XID_)[A-Z][A-Z0-9_]{1,63})$")
# Slurm node names as we accept them from outside: no spaces, no hostlist brackets.
NODE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# An incident id: inc-<UTC date>-<UTC time>-<node>. Anything else is refused before it can
# reach a visibility query.
INCIDENT_ID_PATTERN = re.compile(r"^inc-\d{8}-\d{6}-[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

# Named fault kinds AutoClusters knows besides XID_<n>: what the node agent reports, what the
# shipped alert rules map to, what Crusoe marks a node for, and a human's MANUAL. A cluster's
# policy may name more. Anything else is refused, never guessed (an unknown kind would fall
# to the default rule, which replaces the machine).
NAMED_FAULTS = frozenset(
    {
        "GPU_FELL_OFF_BUS", "GPU_COUNT_LOW", "ECC_DBE", "ROW_REMAP_PENDING",
        "ROW_REMAP_FAILURE", "NVLINK_DOWN", "NVLINK_ERRORS", "GPU_RECOVERY_ACTION",
        "FABRIC_NOT_READY", "THERMAL", "GPU_DRIVER_UNRESPONSIVE", "PCIE_ERRORS",
        "IB_LINK_DOWN", "IB_LINK_DEGRADED", "HCA_FELL_OFF_BUS", "NODE_NOT_READY", "MANUAL",
        # Silent faults, from the jobs' progress (clients/agent/progress_rules.py).
        "JOB_HANG", "SLOW_NODE",
    }
)  # fmt: skip
_XID = re.compile(r"^XID_\d{1,3}$")
XID_KIND = "XID_<n>"  # how the catalogue names every driver Xid at once


class UnknownFaultError(ValueError):
    """A well-formed fault kind that is neither XID_<n> nor in the catalogue."""


def known_faults(policy_faults: Iterable[str] = ()) -> list[str]:
    return sorted(NAMED_FAULTS | set(policy_faults))


# Where a person finds the catalogue: every refusal of an unknown kind points here rather
# than listing it (a list of every kind buries the one line that matters).
CATALOGUE_HINT = "see 'autoclusters faults' for the kinds known"


def unknown_fault_message(fault: str) -> str:
    """One line: the kind (quoted, cut short, control characters escaped) and the hint."""
    return f"unknown fault kind {fault[:64]!r}: {CATALOGUE_HINT}"


def check_known_fault(fault: str, policy_faults: Iterable[str] = ()) -> None:
    """Raise UnknownFaultError (one line, pointing at the catalogue) unless `fault` is one
    we know: XID_<n>, a named kind, or one the cluster's policy names."""
    if _XID.match(fault):
        return
    if fault not in NAMED_FAULTS and fault not in set(policy_faults):
        raise UnknownFaultError(unknown_fault_message(fault))
