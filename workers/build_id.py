"""The worker's build ID: which code it runs, hashed from our own sources.

Temporal records a worker's build ID with each workflow task it completes. The SDK's
default reads and hashes the bytecode of every loaded module (~1,600 in a worker: ~0.1 s
of CPU at each worker start, a tenth of its start-up; more on a loaded machine). This one
hashes what changes between our releases and deployments: the SDK's and Python's versions
and the source of each loaded `autoclusters` module. Same code, same ID; changed code, a
new one.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import temporalio


def code_build_id() -> str:
    """The hash of Python's and the SDK's versions and the loaded `autoclusters` modules'
    sources (name and bytes, in name order)."""
    digest = hashlib.md5(usedforsecurity=False)
    digest.update(f"{sys.version}\0{temporalio.__version__}\0".encode())
    for name in sorted(sys.modules):
        if name != "autoclusters" and not name.startswith("autoclusters."):
            continue
        source = getattr(sys.modules[name], "__file__", None)
        if not source:
            continue  # a namespace package: no file of its own
        digest.update(name.encode() + b"\0")
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()
