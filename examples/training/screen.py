"""The burn-in screen's job step: the agent's active diagnostic, then an all-reduce.

Run by `srun` in the breakfix reservation (activities/screen.py submits it), one task per
rank: the repaired node and, when one was idle, a healthy neighbour. Each node's first
task runs the active diagnostic (clients/agent/diag.py) and prints its line; then every
rank joins one all-reduce group (NCCL on GPUs, gloo on CPU, the training job's
collective) through a FileStore on the shared screen directory (no port to agree on), runs
one warm-up round and `--rounds` timed rounds of a `--size-mib` float32 tensor, and rank 0
prints

    allreduce ranks=<n> nodes=<a,b> backend=<gloo|nccl> size_mib=<m> rounds=<r>
        mean_s=<s> algbw_gbps=<x> busbw_gbps=<y> correct=<1|0>      (one line)

(bus bandwidth as NCCL-tests report it: algbw * 2(n-1)/n). Before the all-reduce, every
rank times a matrix multiply on its device (bf16 on a GPU, float32 on CPU) and prints

    gemm node=<a> rank=<r> dtype=<bfloat16|float32> n=<n> tflops=<x>

(a GPU that runs slow passes its diagnostic; its GEMM rate shows it). The task exits 1 when its
node's diagnostic failed (after the all-reduce, so its peers are not left waiting), 3 when
the all-reduce's result is wrong.

    srun python examples/training/screen.py --store DIR [--fake-dir DIR] [--size-mib 64]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", type=Path, required=True, help="shared dir for the FileStore")
    ap.add_argument("--fake-dir", type=Path, help="the sandbox's fake-backend files (NODE.json)")
    ap.add_argument("--expected-gpus", type=int)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120, help="collective timeout (s)")
    return ap.parse_args(argv)


def diagnose(node: str, args: argparse.Namespace) -> int:
    from autoclusters.clients.agent import diag

    fake = args.fake_dir / f"{node}.json" if args.fake_dir else None
    return diag.main(
        ["--node", node]
        + (["--fake-file", str(fake)] if fake else [])
        + (["--expected-gpus", str(args.expected_gpus)] if args.expected_gpus else [])
    )


def gemm_rate(rank: int, node: str) -> None:
    """One line: this rank's matrix-multiply rate, best of a few timed rounds after a warm-up
    (the best, not the mean: a rate under the floor must be the GPU's, not a hiccup)."""
    import torch

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("SLURM_LOCALID", "0"))) if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    n = 8192 if cuda else 512
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    best = float("inf")
    for i in range(6):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize()
        if i:  # the first round warms up (kernels chosen, memory touched)
            best = min(best, time.perf_counter() - t0)
    tflops = 2 * n**3 / best / 1e12
    name = str(dtype).removeprefix("torch.")
    print(f"gemm node={node} rank={rank} dtype={name} n={n} tflops={tflops:.3f}", flush=True)


def all_reduce(rank: int, world: int, node: str, args: argparse.Namespace) -> bool:
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("SLURM_LOCALID", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    store = args.store / f"{os.environ.get('SLURM_JOB_ID', 'local')}.store"
    dist.init_process_group(
        backend,
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=args.timeout),
    )
    try:
        n = args.size_mib * 1024 * 1024 // 4
        x = torch.ones(n, dtype=torch.float32, device=device)
        dist.all_reduce(x)  # warm-up: connections, buffers
        took = []
        for _ in range(args.rounds):
            x.fill_(1.0)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if cuda:
                torch.cuda.synchronize()
            took.append(time.perf_counter() - t0)
        ok = bool(torch.all(x == float(world)).item())  # every rank's ones summed
        names: list[str] = [""] * world
        dist.all_gather_object(names, node)
        if rank == 0:
            mean = sum(took) / len(took)
            algbw = args.size_mib * 1024 * 1024 / mean / 1e9
            busbw = algbw * 2 * (world - 1) / world
            nodes = ",".join(sorted(set(names)))
            print(
                f"allreduce ranks={world} nodes={nodes} backend={backend} "
                f"size_mib={args.size_mib} rounds={args.rounds} mean_s={mean:.6f} "
                f"algbw_gbps={algbw:.3f} busbw_gbps={busbw:.3f} correct={int(ok)}",
                flush=True,
            )
        return ok
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    diag_rc = diagnose(node, args) if os.environ.get("SLURM_LOCALID", "0") == "0" else 0
    gemm_rate(rank, node)
    ok = all_reduce(rank, world, node, args)
    if diag_rc:
        return 1
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
