"""The node agent as the DaemonSet it ships as (deploy/kubernetes/agent.yaml), on the CMK
platform of the sandbox.

`sandbox up --platform cmk` applies the shipped DaemonSet to the Kubernetes emulator as the
file has it (what `kubectl get ds -n autoclusters -o yaml` shows is the shipped object), with
the two Secrets it reads (`autoclusters-api-tokens`: the sandbox API's agent token;
`autoclusters-metrics`). The emulator's DaemonSet controller makes one pod per GPU Node
(sandbox/kubernetes/daemonsets.py), and the emulated kubelet (sandbox/slinky/agent_pods.py)
runs each pod's container as a process on this machine: the container's args with `$(VAR)` expanded
from its env, its env resolved (fieldRef, secretKeyRef), its hostPath mounts as per-node
directories.

What the sandbox cannot run as shipped, it substitutes here, and only here, each rule
naming the exact shipped text it replaces and why (`ARG_RULES`, `ENV_RULES`, `HOST_DIRS`).
`render` refuses (`ManifestDrift`) a container with anything no rule and no `KEPT_*` entry
accounts for, or a rule whose shipped text is gone: a change to the manifest's command,
args, env or mounts stops the sandbox's agents (and fails tests/emulators/test_agent_daemonset.py)
until this file says how the sandbox runs it. The Service and the ServiceAccount are not
applied: the emulator serves neither kind, and nothing in the sandbox reads them.
"""

from __future__ import annotations

import base64
import re
import secrets
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from autoclusters.sandbox.runtime.config import GPUS_PER_NODE, SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError, agent_env

Obj = dict[str, Any]
MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "agent.yaml"
NAMESPACE = "autoclusters"
DAEMONSET = "autoclusters-agent"
APP_LABEL = "app.kubernetes.io/name"
APP = "autoclusters-agent"
# The image's ENTRYPOINT (Dockerfile: `ENTRYPOINT ["autoclusters"]`), as this machine runs
# it: the agent's own entry point, which takes the same `agent run ...` arguments and loads
# the agent's commands alone (as sandbox/runtime/daemons.py agent_argv does).
IMAGE = "autoclusters"
ENTRYPOINT = [sys.executable, "-m", "autoclusters.clients.cli.agent"]
CONTAINER_ID = "pid://"  # a sandbox container's id: its process's PID


class ManifestDrift(SandboxError):
    """The shipped manifest has a shape the sandbox has no rule for (or lost one it had)."""


@dataclass(frozen=True)
class Node:
    """What the kubelet knows of the machine a pod runs on."""

    name: str  # the Kubernetes Node's
    slurm: str  # the Slurm node it runs (Slinky's hostname-override, else the Node's name)


@dataclass(frozen=True)
class Container:
    argv: list[str]
    env: dict[str, str]
    mounts: dict[str, Path]  # mountPath -> the directory on this machine


# --- the substitutions ---------------------------------------------------------------------

ArgRule = Callable[[SandboxConfig, Node], list[str]]

# The args kept as shipped: `$(VAR)` expanded, and a path under a mount read as the
# mount's directory on this machine (the spool: HOST_DIRS).
KEPT_ARGS = ("agent", "run", "--node=$(NODE_NAME)", "--spool-dir=/var/lib/autoclusters/agent")
ARG_RULES: dict[str, tuple[ArgRule, str]] = {
    "--backend=nvml": (
        lambda cfg, n: ["--backend=fake", f"--fake-file={cfg.agent_file(n.slurm)}"],
        "no GPUs here: the fake backend reads the node's file, where `faults inject` writes",
    ),
    "--sysfs-root=/host/sys": (
        lambda cfg, n: [],
        "the fake backend reads InfiniBand from its file; a sysfs root would replace that",
    ),
    "--api=http://autoclusters-api.autoclusters.svc:8480": (
        lambda cfg, n: [f"--api={cfg.api_url}"],
        "the API's Service name resolves nowhere here: the sandbox API's own address",
    ),
    "--metrics-port=9400": (
        lambda cfg, n: [f"--metrics-port={cfg.agent_metrics_port(n.slurm)}"],
        "every emulated Node shares this machine's network: each agent its own port",
    ),
    "--k8s-condition": (
        lambda cfg, n: [],
        "the agent's own GpuUnhealthy would sit beside the runbook's mark on the same Node; "
        "the sandbox shows the runbook's (the agent's is tested on its own, "
        "tests/agent/test_agent_node_condition.py)",
    ),
    "--slurm-name-from-node": (
        lambda cfg, n: ["--slurm-name-from-node", f"--kubeconfig={cfg.kubeconfig}"],
        "no ServiceAccount token in a sandbox pod: the same reads of the agent's Node, through "
        "the sandbox's kubeconfig for the emulator",
    ),
}
# Not in the manifest: the sandbox's faster pace, as on Managed Slurm (daemons.agent_argv).
SANDBOX_ARGS = ("--hold-checks=2", f"--expected-gpus={GPUS_PER_NODE}", "--snapshot-interval=2")

EnvRule = Callable[[SandboxConfig, Node], str | None]  # None: not set

# Env entries kept as shipped (a value, or a secretKeyRef read from the emulator's Secret).
KEPT_ENV: dict[str, Obj] = {
    "AUTOCLUSTERS_AGENT_TOKEN": {
        "valueFrom": {
            "secretKeyRef": {"name": "autoclusters-api-tokens", "key": "AUTOCLUSTERS_AGENT_TOKEN"}
        }
    },
    "NVIDIA_VISIBLE_DEVICES": {"value": "all"},
    "NVIDIA_DRIVER_CAPABILITIES": {"value": "utility"},
}
ENV_RULES: dict[str, tuple[Obj, EnvRule, str]] = {
    "NODE_NAME": (
        {"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        lambda cfg, n: n.name,
        "the downward API's spec.nodeName, resolved as the kubelet does: the Kubernetes Node "
        "(cmk-gpu-1); the agent reads the Slurm node it runs (gpu-01) off that Node itself "
        "(--slurm-name-from-node)",
    ),
    "AUTOCLUSTERS_AGENT_METRICS_HOST": (
        {"value": "0.0.0.0"},
        lambda cfg, n: "127.0.0.1",
        "the emulated Nodes share this machine: Prometheus scrapes the agents on loopback",
    ),
    "AUTOCLUSTERS_AGENT_METRICS_TOKEN": (
        {"valueFrom": {"secretKeyRef": {"name": "autoclusters-metrics", "key": "token"}}},
        lambda cfg, n: None,
        "on loopback the sandbox's Prometheus scrapes the agents without a token",
    ),
    "AUTOCLUSTERS_AGENT_PROGRESS_DIR": (
        {"value": "/run/autoclusters/progress"},
        lambda cfg, n: str(_progress_dir(cfg, n)),
        "the progress mount as this machine has it (no mount namespace): the sandbox's own "
        "directory, which its training jobs write",
    ),
    "AUTOCLUSTERS_AGENT_POLICY_FILE": (
        {"value": "/etc/autoclusters/policy/policy.yaml"},
        lambda cfg, n: str(cfg.policy_file),
        "the policy ConfigMap's file as this machine has it: the sandbox's policy",
    ),
}


def _progress_dir(cfg: SandboxConfig, n: Node) -> Path:
    # One per sandbox, shared by its nodes as a job's nodes share its directory on shared
    # storage (SandboxConfig.progress_dir, docs/detection.md).
    return cfg.progress_dir


# hostPath volumes: the shipped host path -> the node's directory in the sandbox.
HOST_DIRS: dict[str, tuple[Callable[[SandboxConfig, Node], Path], str]] = {
    "/sys": (
        lambda cfg, n: cfg.state_dir / "agent" / f"{n.slurm}.sys",
        "an empty stand-in: the fake backend reads no sysfs (--sysfs-root is dropped)",
    ),
    "/var/lib/autoclusters/agent": (
        lambda cfg, n: cfg.agent_spool(n.slurm),
        "the node's disk: a reboot keeps it, a new machine starts without it",
    ),
    "/run/autoclusters/progress": (
        _progress_dir,
        "the jobs' progress files (silent faults): the sandbox's one directory",
    ),
}
# configMap volumes: the ConfigMap -> the directory on this machine that holds its files.
CONFIG_MAPS: dict[str, tuple[Callable[[SandboxConfig, Node], Path], str]] = {
    "autoclusters-policy": (
        lambda cfg, n: cfg.policy_file.parent,
        "the sandbox's policy.yaml, the file the ConfigMap is made from in a deployment",
    ),
}


def _volume_dirs(volumes: list[Obj]) -> dict[str, str | None]:
    """Each volume's key into HOST_DIRS (a hostPath) or CONFIG_MAPS (a configMap)."""
    return {
        v["name"]: (v.get("hostPath") or {}).get("path") or (v.get("configMap") or {}).get("name")
        for v in volumes
    }


def _volume_dir(key: str, cfg: SandboxConfig, node: Node) -> Path:
    rule = HOST_DIRS.get(key) or CONFIG_MAPS[key]
    return rule[0](cfg, node)


def sandbox_env(cfg: SandboxConfig) -> dict[str, str]:
    """Not in the manifest: the sandbox's short latches, and the fault path it is set up
    for (daemons.agent_env, less the token, which the pod reads from its Secret)."""
    env = agent_env(cfg)
    env.pop("AUTOCLUSTERS_AGENT_TOKEN", None)
    return env


# --- the manifest --------------------------------------------------------------------------


def load(path: Path = MANIFEST) -> Obj:
    """The shipped DaemonSet (the file's other documents are the Service)."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except (OSError, yaml.YAMLError) as e:
        raise SandboxError(f"{path}: cannot read the agent's DaemonSet: {e}") from e
    found = [d for d in docs if d.get("kind") == "DaemonSet"]
    if len(found) != 1:
        raise ManifestDrift(f"{path}: expected one DaemonSet, found {len(found)}")
    ds: Obj = found[0]
    return ds


def agent_container(pod_spec: Obj) -> Obj:
    containers = pod_spec.get("containers") or []
    if len(containers) != 1:
        raise ManifestDrift(f"the agent's pod has {len(containers)} containers, the sandbox runs 1")
    c: Obj = containers[0]
    return c


def check(ds: Obj) -> None:
    """Every rule still meets its shipped text, and nothing shipped is unaccounted for."""
    spec = ds["spec"]["template"]["spec"]
    _check_container(agent_container(spec), spec.get("volumes") or [])


def _check_container(c: Obj, volumes: list[Obj]) -> None:
    problems: list[str] = []
    image = str(c.get("image") or "")
    if image.rsplit(":", 1)[0] != IMAGE:
        problems.append(f"image {image!r}: the sandbox runs only {IMAGE}:<tag>")
    if c.get("command"):
        problems.append(f"command {c['command']}: the sandbox runs the image's entrypoint")
    args = [str(a) for a in c.get("args") or []]
    problems += [f"arg {a!r}: no rule" for a in args if a not in KEPT_ARGS and a not in ARG_RULES]
    problems += [f"arg {a!r}: the rule's text is not shipped" for a in ARG_RULES if a not in args]
    problems += [f"arg {a!r}: kept, but not shipped" for a in KEPT_ARGS if a not in args]
    env = {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in c.get("env") or []}
    for name, source in env.items():
        want = KEPT_ENV.get(name) or (ENV_RULES[name][0] if name in ENV_RULES else None)
        if want is None:
            problems.append(f"env {name}: no rule")
        elif source != want:
            problems.append(f"env {name}: shipped as {source}, the rule is for {want}")
    problems += [f"env {n}: not shipped" for n in (*KEPT_ENV, *ENV_RULES) if n not in env]
    host = _volume_dirs(volumes)
    for m in c.get("volumeMounts") or []:
        path = host.get(m["name"])
        if path not in HOST_DIRS and path not in CONFIG_MAPS:
            problems.append(
                f"mount {m['mountPath']}: volume {m['name']} is not a known hostPath or ConfigMap"
            )
    mounted = {host.get(m["name"]) for m in c.get("volumeMounts") or []}
    problems += [f"hostPath {p}: not mounted" for p in HOST_DIRS if p not in mounted]
    problems += [f"ConfigMap {p}: not mounted" for p in CONFIG_MAPS if p not in mounted]
    if problems:
        raise ManifestDrift(
            "deploy/kubernetes/agent.yaml and the sandbox's rules "
            "(sandbox/slinky/agent_daemonset.py) disagree: " + "; ".join(problems)
        )


# --- a pod's container, as this machine runs it ----------------------------------------------

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined VAR is replaced, an undefined one stays,
    `$$` is a literal `$`."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        m = _VAR.match(text, i)
        if m and m.group(1) in env:
            out.append(env[m.group(1)])
            i = m.end()
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def render(
    cfg: SandboxConfig, pod_spec: Obj, node: Node, secret: Callable[[str, str], str | None]
) -> Container:
    """The process the sandbox starts for the agent pod's container. `secret(name, key)`
    reads the pod's namespace's Secret (None: missing, and the container cannot start)."""
    c = agent_container(pod_spec)
    _check_container(c, pod_spec.get("volumes") or [])
    env: dict[str, str] = {}
    for e in c.get("env") or []:
        name = e["name"]
        if name in ENV_RULES:
            value = ENV_RULES[name][1](cfg, node)
        elif "value" in e:
            value = expand(str(e["value"]), env)
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            value = secret(ref["name"], ref["key"])
            if value is None:
                raise SandboxError(f"secret {ref['name']} key {ref['key']} not found")
        if value is not None:
            env[name] = value
    env.update(sandbox_env(cfg))
    host = _volume_dirs(pod_spec.get("volumes") or [])
    mounts = {
        m["mountPath"]: _volume_dir(str(host[m["name"]]), cfg, node) for m in c["volumeMounts"]
    }
    argv = list(ENTRYPOINT)
    for a in c.get("args") or []:
        arg = str(a)
        if arg in ARG_RULES:
            argv += ARG_RULES[arg][0](cfg, node)
        else:
            argv.append(_in_mounts(expand(arg, env), mounts))
    return Container(argv=argv + list(SANDBOX_ARGS), env=env, mounts=mounts)


def _in_mounts(arg: str, mounts: Mapping[str, Path]) -> str:
    """A path under a mount, as the process sees it on this machine (no mount namespace)."""
    flag, sep, value = arg.partition("=")
    if not sep:
        flag, value = "", arg
    for inside, outside in mounts.items():
        if value == inside or value.startswith(inside.rstrip("/") + "/"):
            value = str(outside) + value[len(inside.rstrip("/")) :]
            break
    return f"{flag}={value}" if flag else value


def pid_of(pod: Obj) -> int | None:
    """The PID the kubelet reported running the pod's container, if any."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        cid = str(c.get("containerID") or "")
        if cid.startswith(CONTAINER_ID) and cid[len(CONTAINER_ID) :].isdigit():
            return int(cid[len(CONTAINER_ID) :])
    return None


def restarts_of(pod: Obj) -> int:
    return max(
        [int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses")
         or []] or [0]
    )  # fmt: skip


# --- installing it ---------------------------------------------------------------------------


def install(cfg: SandboxConfig) -> None:
    """What the `autoclusters` add-on installs on a CMK cluster: the agent's namespace, the
    two Secrets its pods read, and the shipped DaemonSet (checked against the rules first:
    a drifted manifest fails `sandbox up` here, not later in a pod)."""
    ds = load()
    check(ds)
    headers = {"Authorization": f"Bearer {cfg.k8s_token()}"}
    ns = ds["metadata"].get("namespace") or NAMESPACE
    secrets_ = {
        "autoclusters-api-tokens": {"AUTOCLUSTERS_AGENT_TOKEN": cfg.api_token()},
        "autoclusters-metrics": {"token": secrets.token_urlsafe(24)},
    }
    with httpx.Client(
        base_url=cfg.k8s_url, timeout=10, headers=headers, verify=cfg.k8s_tls()
    ) as k8s:
        _create(k8s, "/api/v1/namespaces", {"metadata": {"name": ns}})
        for name, data in secrets_.items():
            encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
            _create(
                k8s,
                f"/api/v1/namespaces/{ns}/secrets",
                {"metadata": {"name": name, "namespace": ns}, "type": "Opaque", "data": encoded},
            )
        _create(k8s, f"/apis/apps/v1/namespaces/{ns}/daemonsets", ds)


def _create(k8s: httpx.Client, path: str, body: Obj) -> None:
    r = k8s.post(path, json=body)
    if r.status_code not in (200, 201, 409):  # 409: there from an earlier start
        raise SandboxError(f"POST {path}: {r.status_code} {r.text[:300]}")
