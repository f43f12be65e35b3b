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
    }
)  # fmt: skip
_XID = re.compile(r"^XID_\d{1,3}$")


class UnknownFaultError(ValueError):
    """A well-formed fault kind that is neither XID_<n> nor in the catalogue."""


def known_faults(policy_faults: Iterable[str] = ()) -> list[str]:
    return sorted(NAMED_FAULTS | set(policy_faults))


def check_known_fault(fault: str, policy_faults: Iterable[str] = ()) -> None:
    """Raise UnknownFaultError (naming the known kinds) unless `fault` is one we know."""
    if _XID.match(fault):
        return
    known = known_faults(policy_faults)
    if fault not in known:
        raise UnknownFaultError(
            f"unknown fault kind {fault[:64]!r}: use XID_<n> or one of {', '.join(known)}"
        )
