"""The agent's active diagnostic: what a burn-in screen runs on a repaired node.

Passive reads (the agent's loop) see what NVML reports unprompted; a marginal GPU reads
healthy until it is loaded. The active diagnostic loads it:

- on a GPU node: `dcgmi diag -r <level>` (DCGM's memory, PCIe and stress tests) when DCGM
  is installed; otherwise NVML's own answers for every GPU, read once more right now (lost,
  reset required, uncorrected ECC, row remapping pending or failed) — weaker, and said so;
- on the fake backend (the sandbox): the node's file's `diag_failures` (what the sandbox
  injected as a latent fault: `fake_backend.LATENT_FAULTS`) and the same NVML-shaped
  checks on its readings.

`python -m autoclusters.clients.agent.diag --node N [--fake-file F]` prints one line
`diag node=N result=pass|fail method=... detail=...` and exits 0 (pass) or 1 (fail); an
unreadable backend is a failure (2): a node whose GPUs cannot be read is not screened.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from autoclusters.clients.agent.readings import GpuReadings

DCGM_LEVEL = 2  # medium: memory, PCIe bandwidth, a short stress (about 2 minutes)
DCGM_TIMEOUT_S = 900


@dataclass
class DiagResult:
    node: str
    method: str  # fake | dcgm | nvml
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def line(self) -> str:
        detail = "; ".join(self.failures) or "all GPUs passed"
        return (
            f"diag node={self.node} result={'pass' if self.passed else 'fail'} "
            f"method={self.method} detail={json.dumps(detail)}"
        )


def judge_readings(readings: GpuReadings, expected_gpus: int | None) -> list[str]:
    """What a fresh read of every GPU shows wrong (the NVML-shaped half of the diag)."""
    bad: list[str] = []
    if expected_gpus is not None and len(readings.gpus) < expected_gpus:
        bad.append(f"{len(readings.gpus)} of {expected_gpus} GPUs")
    for g in readings.gpus:
        if g.lost:
            bad.append(f"GPU {g.index}: lost")
        if g.reset_required:
            bad.append(f"GPU {g.index}: reset required")
        if g.ecc_uncorrected_volatile:
            bad.append(f"GPU {g.index}: {g.ecc_uncorrected_volatile} uncorrected ECC errors")
        rows = g.remapped_rows
        if rows is not None and (rows.pending or rows.failure):
            bad.append(f"GPU {g.index}: row remapping {'failed' if rows.failure else 'pending'}")
    return bad


def fake_diag(node: str, path: Path) -> DiagResult:
    from autoclusters.clients.agent import fake_backend

    fake = fake_backend.read_node(path)
    found = judge_readings(fake.gpus, fake.shape.get("gpus"))
    return DiagResult(node=node, method="fake", failures=[*found, *fake.diag_failures])


def dcgm_diag(node: str, dcgmi: str, level: int = DCGM_LEVEL) -> DiagResult:
    """`dcgmi diag -r level -j`: every test whose result is Fail is a failure."""
    try:
        out = subprocess.run(
            [dcgmi, "diag", "-r", str(level), "-j"],
            capture_output=True,
            text=True,
            timeout=DCGM_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return DiagResult(node, "dcgm", [f"dcgmi diag -r {level} gave no answer"])
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        why = (out.stderr or out.stdout).strip()[:200] or f"exit {out.returncode}"
        return DiagResult(node, "dcgm", [f"dcgmi diag printed no JSON: {why}"])
    failures = [
        f"{test.get('name', '?')}: {res.get('info') or res.get('warnings') or 'Fail'}"
        for cat in doc.get("DCGM GPU Diagnostic", {}).get("test_categories", [])
        for test in cat.get("tests", [])
        for res in test.get("results", [])
        if str(res.get("status", "")).lower() == "fail"
    ]
    if out.returncode != 0 and not failures:
        failures.append(f"dcgmi diag exited {out.returncode}")
    return DiagResult(node, "dcgm", failures)


def nvml_diag(node: str, expected_gpus: int | None) -> DiagResult:
    from autoclusters.clients.agent.nvml_backend import NvmlBackend

    backend = NvmlBackend()
    backend.open()
    try:
        return DiagResult(node, "nvml", judge_readings(backend.read(), expected_gpus))
    finally:
        backend.close()


def run_diag(node: str, fake_file: Path | None, expected_gpus: int | None) -> DiagResult:
    if fake_file is not None:
        return fake_diag(node, fake_file)
    dcgmi = shutil.which("dcgmi")
    return dcgm_diag(node, dcgmi) if dcgmi else nvml_diag(node, expected_gpus)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node", default=socket.gethostname())
    ap.add_argument("--fake-file", type=Path, help="the fake backend's file (the sandbox)")
    ap.add_argument("--expected-gpus", type=int)
    args = ap.parse_args(argv)
    try:
        result = run_diag(args.node, args.fake_file, args.expected_gpus)
    except Exception as e:  # the GPUs could not be read at all: not a pass
        print(f"diag node={args.node} result=fail method=none detail={json.dumps(repr(e))}")
        return 2
    print(result.line(), flush=True)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
