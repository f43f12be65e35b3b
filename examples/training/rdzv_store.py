"""The rendezvous store of train.sbatch's in-job mode, run by the batch shell.

torchrun's c10d rendezvous keeps its state in a TCPStore. By default the first agent hosts
it: if that node is the one that fails, the state goes with it and the job with it. This
store belongs to the batch shell instead (the agents are started with `is_host=false`), so
any training node may be lost. Runs until killed.

    python rdzv_store.py <port>
"""

from __future__ import annotations

import sys
import time
import warnings
from datetime import timedelta

# The CPU wheel warns on import when numpy is absent; this never touches numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch.distributed as dist  # noqa: E402


def main() -> None:
    port = int(sys.argv[1])
    # multi_tenant: torchrun's agents (and nothing else) connect; no client count to wait for.
    store = dist.TCPStore(
        "0.0.0.0", port, is_master=True, multi_tenant=True, wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    print(f"rdzv_store listening port={port}", flush=True)
    while store:  # held: the server lives as long as this object
        time.sleep(3600)


if __name__ == "__main__":
    main()
