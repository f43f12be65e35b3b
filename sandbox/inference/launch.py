"""The sandbox's inference side in Kubernetes mode: the `inference` namespace and
Deployment on the emulator (replicas 0: the sharing workflow scales it), the inference kubelet
that runs its pods' servers, and the gateway in front of them. `sandbox up --k8s` starts
both processes after the emulator; `sandbox down` stops them and every server, by PID.

The emulator runs with `--external-kubelet` = the inference pods' selector, so their
servers, readiness and graceful deletion are this kubelet's (sandbox/inference/kubelet.py).
"""

from __future__ import annotations

import sys
from typing import Any

import httpx

from autoclusters.core.sharing import INFERENCE_APP, INFERENCE_APP_LABEL, POOL_LABEL
from autoclusters.integrations.tls import default_verify
from autoclusters.sandbox.inference import pods as inference_pods
from autoclusters.sandbox.runtime.config import GPUS_PER_NODE, SandboxConfig

KUBELET = "inference-kubelet"
GATEWAY = "inference-gateway"
NAMESPACE = "inference"
DEPLOYMENT = "inference"
IMAGE = "ghcr.io/autoclusters/inference-standin:sandbox"
SERVER_PORT = 8000  # the container port the manifest names (the stand-in picks its own)


def emulator_args() -> list[str]:
    """Added to the Kubernetes emulator's command line in the sandbox."""
    return ["--external-kubelet", inference_pods.SELECTOR]


def file_sd(cfg: SandboxConfig) -> str:
    return str(cfg.state_dir / "monitoring" / "inference-servers.json")


def kubelet_argv(cfg: SandboxConfig) -> list[str]:
    return [
        sys.executable, "-m", "autoclusters.sandbox.inference.kubelet",
        "--kubeconfig", str(cfg.kubeconfig), "--state-dir", str(cfg.state_dir),
        "--file-sd", file_sd(cfg),
    ]  # fmt: skip


def gateway_argv(cfg: SandboxConfig) -> list[str]:
    return [
        sys.executable, "-m", "autoclusters.sandbox.inference.gateway",
        "--kubeconfig", str(cfg.kubeconfig), "--port", str(cfg.inference_gateway_port),
    ]  # fmt: skip


def gateway_ready(cfg: SandboxConfig) -> bool:
    try:
        return (
            httpx.get(
                f"{cfg.inference_gateway_url}/healthz", timeout=2, verify=default_verify()
            ).status_code
            == 200
        )
    except httpx.HTTPError:
        return False


def deployment(replicas: int = 0, gpus: int = GPUS_PER_NODE) -> dict[str, Any]:
    """The inference Deployment (the sharing contract): one pod per node (it asks for all the
    node's GPUs), only on nodes lent to inference (the pool label; no toleration for the
    training pool's taint)."""
    labels = {INFERENCE_APP_LABEL: INFERENCE_APP}
    gpu = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {POOL_LABEL: "inference"},
                    "terminationGracePeriodSeconds": 30,
                    "containers": [
                        {
                            "name": "server",
                            "image": IMAGE,
                            "ports": [{"containerPort": SERVER_PORT, "name": "http"}],
                            "resources": {"requests": gpu, "limits": gpu},
                            "readinessProbe": {
                                "httpGet": {"path": "/healthz", "port": SERVER_PORT},
                                "periodSeconds": 1,
                            },
                        }
                    ],
                },
            },
        },
    }


def seed(cfg: SandboxConfig, *, url: str | None = None, token: str | None = None) -> None:
    """The `inference` namespace and Deployment (replicas 0); idempotent. `url`/`token`:
    another API server than the sandbox's (a test's plain-HTTP emulator)."""
    headers = {"Authorization": f"Bearer {token or cfg.k8s_token()}"}
    verify = True if url else cfg.k8s_tls()
    with httpx.Client(
        base_url=url or cfg.k8s_url, timeout=10, headers=headers, verify=verify
    ) as k8s:
        r = k8s.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}})
        if r.status_code not in (201, 409):
            r.raise_for_status()
        r = k8s.post(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", json=deployment())
        if r.status_code not in (201, 409):
            r.raise_for_status()
