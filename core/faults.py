"""What a fault kind and a node name may look like, wherever they come from."""

from __future__ import annotations

import re

# XID_<n> from the driver, or a named fault such as GPU_FELL_OFF_BUS / IB_LINK_DOWN / MANUAL.
FAULT_PATTERN = re.compile(r"^(XID_\d{1,3}|(?!XID_)[A-Z][A-Z0-9_]{1,63})$")
# Slurm node names as we accept them from outside: no spaces, no hostlist brackets.
NODE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# An incident id: inc-<UTC date>-<UTC time>-<node>. Anything else is refused before it can
# reach a visibility query.
INCIDENT_ID_PATTERN = re.compile(r"^inc-\d{8}-\d{6}-[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
