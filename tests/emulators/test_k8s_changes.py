"""The watch that wakes the sandbox's inference kubelet and gateway (sandbox/inference/changes.py),
against the Kubernetes emulator: a change to a watched list wakes the loop at once, a change
outside the selector does not, and a watch the server ends wakes it too (what changed
meanwhile is unknown, so the loop reads again)."""

from __future__ import annotations

import asyncio

import httpx

from autoclusters.sandbox.inference.changes import Changes
from autoclusters.sandbox.inference.pods import SELECTOR
from autoclusters.sandbox.kubernetes.emulator import running

TOKEN = "test-token"
# Long enough that a wait that returns True within WOKEN_S was woken by the watch.
RESYNC_S, WOKEN_S = 60.0, 10.0


def _pod(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


async def test_a_watched_change_wakes_the_loop_and_an_unwatched_one_does_not() -> None:
    app_label, app = SELECTOR.split("=")
    with running(TOKEN) as emu:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx.AsyncClient(base_url=emu.url, headers=headers, timeout=5) as k8s,
            Changes(k8s, {"/api/v1/pods": {"labelSelector": SELECTOR}}) as changes,
        ):
            assert await changes.wait(0.3) is False  # nothing yet: the resync time passes
            r = await k8s.post(
                "/api/v1/namespaces/default/pods", json=_pod("other", {"app": "else"})
            )
            r.raise_for_status()
            assert await changes.wait(0.5) is False  # not the inference pods
            r = await k8s.post(
                "/api/v1/namespaces/default/pods", json=_pod("serve-0", {app_label: app})
            )
            r.raise_for_status()
            assert await asyncio.wait_for(changes.wait(RESYNC_S), WOKEN_S) is True
            r = await k8s.delete("/api/v1/namespaces/default/pods/serve-0")
            r.raise_for_status()
            assert await asyncio.wait_for(changes.wait(RESYNC_S), WOKEN_S) is True
            emu.store.close_watches()  # the server ends every open watch
            assert await asyncio.wait_for(changes.wait(RESYNC_S), WOKEN_S) is True
