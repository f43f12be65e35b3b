"""What the sandbox's inference kubelet and gateway share: how they reach the emulated
Kubernetes API, and what an inference pod carries.

The kubelet writes the server's port on its pod (`sandbox.autoclusters.io/port`, and its
slots under `sandbox.autoclusters.io/slots`); the gateway routes to a pod that is Ready,
not terminating, and has a port.
"""

from __future__ import annotations

import base64
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from autoclusters.core.sharing import INFERENCE_APP, INFERENCE_APP_LABEL

PORT_ANNOTATION = "sandbox.autoclusters.io/port"
SLOTS_ANNOTATION = "sandbox.autoclusters.io/slots"
SELECTOR = f"{INFERENCE_APP_LABEL}={INFERENCE_APP}"
Pod = dict[str, Any]


@dataclass(frozen=True)
class Access:
    url: str
    token: str
    ca_pem: str = ""  # the server's CA, when the kubeconfig names one (the sandbox's does)

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Access:
        """The current context's server, CA and bearer token (what the sandbox's kubeconfig
        has)."""
        doc = yaml.safe_load(path.read_text())
        ctx_name = doc.get("current-context")
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
        ca_data = cluster.get("certificate-authority-data") or ""
        return cls(
            url=cluster["server"].rstrip("/"),
            token=user["token"],
            ca_pem=base64.b64decode(ca_data).decode() if ca_data else "",
        )

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
            verify=ssl.create_default_context(cadata=self.ca_pem) if self.ca_pem else True,
        )


async def list_pods(k8s: httpx.AsyncClient, selector: str = SELECTOR) -> list[Pod]:
    r = await k8s.get("/api/v1/pods", params={"labelSelector": selector})
    r.raise_for_status()
    items: list[Pod] = r.json()["items"]
    return items


def is_ready(pod: Pod) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def terminating(pod: Pod) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def port(pod: Pod) -> int | None:
    raw = (pod["metadata"].get("annotations") or {}).get(PORT_ANNOTATION)
    return int(raw) if raw and raw.isdigit() else None


def slots(pod: Pod, default: int) -> int:
    raw = (pod["metadata"].get("annotations") or {}).get(SLOTS_ANNOTATION)
    return int(raw) if raw and raw.isdigit() else default


def serving(pod: Pod) -> bool:
    """The gateway may send this pod new requests."""
    return is_ready(pod) and not terminating(pod) and port(pod) is not None


def key(pod: Pod) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
