"""Provider crusoe-cmk's old import path, kept for the worker (workers/remediation.py)
while it still imports CmkProvider from here; the implementation is
activities/cluster_providers/cmk.py."""

from autoclusters.activities.cluster_providers.cmk import CmkProvider

__all__ = ["CmkProvider"]
