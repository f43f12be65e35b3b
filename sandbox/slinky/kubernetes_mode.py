"""Kubernetes mode of the sandbox: a Slinky-style cluster on the emulated Kubernetes API.

Every Slurm node is also a Kubernetes Node (providerID `crusoe://<vm id>`) running a
slurmd pod owned by the NodeSet `gpu`, which the emulated Slinky operator keeps
(`sandbox/slinky/operator.py`, the `slinky-operator` process). The machines are the Crusoe
emulator's VMs, in every mode (`sandbox/crusoe/cloud_api.py`); each registers its Node when it
boots.
"""

from __future__ import annotations

import os
import secrets
import sys

import httpx

from autoclusters.sandbox.crusoe.cloud_api import (  # noqa: F401  (names other modules use)
    CRUSOE_EMULATOR,
    answers,
    crusoe_emulator_argv,
    crusoe_emulator_env,
)
from autoclusters.sandbox.kubernetes import tls as k8s_tls
from autoclusters.sandbox.machines.backend import NODESET, SLURM_NAMESPACE
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.slinky import pool_size

K8S_EMULATOR = "k8s-emulator"
# The emulated Slinky NodeSet controller (sandbox/slinky/operator.py): it keeps one slurmd
# pod per GPU Node and carries cordons into Slurm, as SchedMD's operator does.
OPERATOR = "slinky-operator"
# Its pass every 2 s (the operator's own default): each pass lists the Nodes and pods and
# runs `sinfo --json`, and a sandbox stands by for most of its life. SchedMD's operator
# reacts to watch events; a cordon here reaches Slurm within one pass.
OPERATOR_POLL_S = 2.0


def prepare(cfg: SandboxConfig) -> None:
    """The token, the emulator's certificate and the one kubeconfig (HTTPS, that CA, the
    token), as a real cluster hands them out: the worker, the sandbox's own clients and
    kubectl all use it."""
    k8s_dir = cfg.state_dir / "k8s"
    k8s_dir.mkdir(parents=True, exist_ok=True)
    token_file = k8s_dir / "token"
    if not token_file.exists():
        token_file.write_text(secrets.token_urlsafe(24))
        os.chmod(token_file, 0o600)
    cert, _ = k8s_tls.certificate(k8s_dir)
    cfg.kubeconfig.write_text(
        k8s_tls.kubeconfig(
            cfg.k8s_url, cfg.k8s_token(), cert.read_text(), name=cfg.cluster, user="autoclusters"
        )
    )
    os.chmod(cfg.kubeconfig, 0o600)


def k8s_emulator_argv(cfg: SandboxConfig) -> list[str]:
    return [
        sys.executable, "-m", "autoclusters.sandbox.kubernetes.emulator",
        # One argument, `--token=...`: a urlsafe token may begin with "-", which argparse
        # reads as the next option when the value stands alone (a 1-in-64 failed start).
        "--port", str(cfg.k8s_port), f"--token={cfg.k8s_token()}",
        # HTTPS, with the certificate `prepare` made (the kubeconfig trusts that one).
        "--cert-dir", str(cfg.k8s_ca.parent),
        "--state", str(cfg.emulator_state(K8S_EMULATOR)),
    ]  # fmt: skip


def k8s_answers(cfg: SandboxConfig) -> bool:
    """Is the emulator up (its admin API answers over HTTPS)?"""
    try:
        r = httpx.get(f"{cfg.k8s_url}/_emulator/state", timeout=1, verify=cfg.k8s_tls())
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def operator_argv(cfg: SandboxConfig) -> list[str]:
    argv = [
        sys.executable, "-m", "autoclusters.sandbox.slinky.operator",
        "--kubeconfig", str(cfg.kubeconfig), "--slurm-conf", str(cfg.slurm_conf),
        "--poll-s", str(OPERATOR_POLL_S),
    ]  # fmt: skip
    if not cfg.cmk:  # (CMK: with the platform's own arguments, the autoscaler's included)
        # The cluster autoscaler grows the Managed Slurm cluster's node set on a scale-out.
        argv += ["--cloud-state-dir", str(cfg.state_dir),
                 "--max-pool-nodes", str(pool_size.max_nodes(cfg))]  # fmt: skip
    return argv


def seed(cfg: SandboxConfig) -> None:
    """The slurm namespace and the NodeSet `gpu` (DaemonSet mode: no `replicas`, one slurmd
    pod on every GPU Node); its Nodes register as the provisioning's machines boot
    (`sandbox.machines.backend.SandboxMachines`) and the operator gives each its pod.

    The published schema requires `controllerRef` (the emulator refuses a NodeSet without
    one, as a real API server does); no Controller object is seeded, since nothing here
    reads it. `scalingMode` is said, since it defaults to StatefulSet on a real cluster."""
    headers = {"Authorization": f"Bearer {cfg.k8s_token()}"}
    with httpx.Client(base_url=cfg.k8s_url, timeout=10, verify=cfg.k8s_tls()) as k8s:
        k8s.post(
            "/api/v1/namespaces", json={"metadata": {"name": SLURM_NAMESPACE}}, headers=headers
        )
        r = k8s.post(
            f"/apis/slinky.slurm.net/v1beta1/namespaces/{SLURM_NAMESPACE}/nodesets",
            json={
                "apiVersion": "slinky.slurm.net/v1beta1",
                "kind": "NodeSet",
                "metadata": {"name": NODESET, "namespace": SLURM_NAMESPACE, "uid": cfg.nodeset_uid},
                "spec": {"controllerRef": {"name": cfg.cluster}, "scalingMode": "DaemonSet"},
            },
            headers=headers,
        )
        if r.status_code not in (200, 201, 409):
            r.raise_for_status()
