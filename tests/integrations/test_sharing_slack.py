"""A GPU-sharing move waiting for approval, decided from its Slack message.

The real GpuSharing on the time-skipping test server (the fake world of tests/fakes/sharing.py,
its `notify` also posting through the real SlackNotifier to the Slack emulator), the real
API app (`create_app`, in uvicorn on loopback) serving `POST /slack/interactions`, clicks
signed as Slack signs them (by the emulator, or here with HMAC-SHA256 over the raw body).

Aspects covered:
- a move needing approval posts one message with Approve / Reject (confirm dialogs), the
  buttons' value naming the move and the step `move`; the links go to the sharing workflow;
- an Approve click lets the move proceed and records the Slack approver; the message is
  marked decided; a Reject click (a member of the approver group) stops it, `rejected by
  <name>`, the node stays in training;
- a click on an already decided move, or on an unknown one, is refused with the reason
  (an ephemeral message), and changes neither the move nor the message; a forged click
  is 401 and decides nothing;
- `decide_waiting_move`'s validator: unknown, already decided, finished, no name, no proof;
- `share approve|reject`, through the real API with the person's own operator token (the
  API names them and signs the proof): an unknown move exits 1 with the reason; a waiting
  one is decided as the token's person; `--by` is gone; a reader's token is refused (403)
  and an unknown one (401), deciding nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr
from temporalio import activity
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from autoclusters.clients.api.app import create_app
from autoclusters.clients.cli.share import share_app
from autoclusters.clients.inventory import StaticInventory
from autoclusters.clients.sharing import MoveRefused, decide_move
from autoclusters.core.models import Notification
from autoclusters.core.settings_groups import ApprovalSettings, TemporalSettings
from autoclusters.core.sharing import MoveDecision, MoveRecord, Pool, ShareStatus
from autoclusters.core.slack_config import SlackConfig
from autoclusters.integrations.slack import Links, SlackNotifier, slack_web_client
from autoclusters.integrations.slack.cards import IncidentCard, card_message
from autoclusters.sandbox.crusoe.emulator import EmulatorServer
from autoclusters.sandbox.slack.emulator import EmulatorConfig
from autoclusters.sandbox.slack.emulator import create_app as slack_emulator
from autoclusters.workflows.gpu_sharing import GpuSharing
from tests.decisions import APPROVAL_KEY, signed_move
from tests.fakes.sharing import LEND_STEPS, ShareWorld
from tests.helpers import HermeticSettings, eventually, skip_time
from tests.workflows.test_gpu_sharing import HIGH, RunningSharing, nodes, policy, running_sharing

pytestmark = pytest.mark.workflow

TOKEN = "xoxb-test-token"
SECRET = "share-signing-secret"
READER = "a-readers-token-0123456"
CAROL = "carols-own-token-0123456"  # an operator: the API decides as carol
CHANNEL = "C00000001"  # the emulator's first channel
APPROVERS_GROUP = "S0APPROVERS"
UI = "http://temporal.test:8233"


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    config = EmulatorConfig(
        token=TOKEN,
        signing_secret=SECRET,
        users={"U_ALICE": "alice", "U_BOB": "bob", "U_MALLORY": "mallory"},
        usergroups={APPROVERS_GROUP: ["U_BOB"]},
    )
    with EmulatorServer(slack_emulator(config)) as server:
        yield server


class SlackWorld(ShareWorld):
    """The fake world whose notifications also go to Slack, as the worker's notify does."""

    notifier: SlackNotifier

    @activity.defn(name="notify")
    async def notify(self, note: Notification) -> None:
        await ShareWorld.notify(self, note)
        await self.notifier.send(note)


@dataclass
class Setup:
    r: RunningSharing
    world: SlackWorld
    admin: httpx.AsyncClient  # the emulator's controls
    interactions_url: str  # the real API's /slack/interactions
    api_url: str  # the same API, for the CLI's decisions

    async def status(self) -> ShareStatus:
        return await self.r.status()

    async def message(self) -> dict[str, Any]:
        view = (await self.admin.get(f"/_emulator/channels/{CHANNEL}")).json()
        (parent,) = view["messages"]
        return dict(parent)

    async def ephemeral(self) -> list[dict[str, Any]]:
        view = (await self.admin.get(f"/_emulator/channels/{CHANNEL}")).json()
        return list(view["ephemeral"])

    async def click(self, move_id: str, action: str, user: str) -> dict[str, Any]:
        """Slack's click, through the emulator: a signed block_actions POST to the API."""
        body = {"incident_id": move_id, "action": action, "user": user}
        resp = await self.admin.post("/_emulator/click", json=body)
        return dict(resp.raise_for_status().json())

    async def post(self, payload: dict[str, Any], *, secret: str = SECRET) -> httpx.Response:
        """A click built here and signed as Slack signs: v0=HMAC-SHA256(v0:ts:body)."""
        body = urlencode({"payload": json.dumps(payload)}).encode()
        ts = str(int(time.time()))
        mac = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256)
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": f"v0={mac.hexdigest()}",
        }
        async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
            return await http.post(self.interactions_url, content=body, headers=headers)


def click_payload(
    message: dict[str, Any], action: str, user: str, *, value: str | None = None
) -> dict[str, Any]:
    """The block_actions payload of a click on `message`'s `action` button (its value, or
    `value` in its place)."""
    (block,) = [b for b in message["blocks"] if b["type"] == "actions"]
    button = next(e for e in block["elements"] if e["action_id"] == action)
    return {
        "type": "block_actions",
        "user": {"id": user, "username": user.removeprefix("U_").lower()},
        "container": {"type": "message", "message_ts": message["ts"], "channel_id": CHANNEL},
        "channel": {"id": CHANNEL},
        "message": {"ts": message["ts"], "blocks": message["blocks"]},
        "actions": [
            {
                "type": "button",
                "action_id": action,
                "block_id": block["block_id"],
                "value": value if value is not None else button["value"],
            }
        ],
    }


def actions_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in message["blocks"] if b["type"] == "actions"]


@pytest_asyncio.fixture
async def setup(env: WorkflowEnvironment, emulator: EmulatorServer) -> AsyncIterator[Setup]:
    """A sharing workflow in approval mode whose first move waits for a human, its message in
    Slack, and the API ready for the clicks."""
    world = SlackWorld(nodes(4), [HIGH])
    world.notifier = SlackNotifier(
        client=slack_web_client(token=TOKEN, base_url=f"{emulator.url}/api/", timeout_s=2),
        channel=CHANNEL,
        links=Links(temporal_ui_url=UI),
        send_timeout_s=5.0,
    )
    target = env.client.service_client.config.target_host

    async def connect() -> Client:
        return await Client.connect(target, data_converter=pydantic_data_converter)

    pol = policy(needs_approval=True, max_inference_nodes=3)
    async with (
        running_sharing(env, world, pol) as r,
        httpx.AsyncClient(base_url=emulator.url, timeout=30, trust_env=False) as admin,
    ):
        settings = HermeticSettings(
            cluster=r.cluster,
            api_inventory="static",
            temporal=TemporalSettings(address=target),
            slack=SlackConfig(
                token=SecretStr(TOKEN),
                channel=CHANNEL,
                base_url=f"{emulator.url}/api/",
                signing_secret=SecretStr(SECRET),
                approvers={"U_ALICE": "alice"},
                approver_group_id=APPROVERS_GROUP,
                request_timeout_s=2,
            ),
            api_tokens={"reader": READER},
            api_operators={"carol": hashlib.sha256(CAROL.encode()).hexdigest()},
            approval=ApprovalSettings(keys=[APPROVAL_KEY]),
        )
        app = create_app(settings, client_factory=connect, inventory=StaticInventory([]))
        with EmulatorServer(app) as api:
            url = f"{api.url}/slack/interactions"
            await admin.put("/_emulator/config", json={"interactivity_url": url})
            s = Setup(r=r, world=world, admin=admin, interactions_url=url, api_url=api.url)
            await r.evaluate()
            await r.handle.signal(GpuSharing.evaluate_now, "breach")
            yield s


async def waiting(s: Setup) -> tuple[MoveRecord, dict[str, Any]]:
    """The move waiting for approval, once its message carries the buttons."""

    async def check() -> tuple[MoveRecord, dict[str, Any]] | None:
        st = await s.status()
        if not (st.current and st.current.status == "waiting_approval"):
            return None
        view = (await s.admin.get(f"/_emulator/channels/{CHANNEL}")).json()
        found = [m for m in view["messages"] if actions_of(m)]
        return (st.current, found[0]) if found else None

    return await eventually(check, what="a move waiting for approval, with its buttons")


async def finished(s: Setup, move_id: str) -> MoveRecord:
    async def check() -> MoveRecord | None:
        st = await s.status()
        done = [m for m in st.moves if m.move.move_id == move_id and m.finished_at]
        return done[0] if done and st.current is None else None

    return await eventually(check, what=f"move {move_id} to end")


async def outcome(s: Setup, text: str) -> dict[str, Any]:
    """The move's message once it shows `text` (the workflow's outcome notice)."""

    async def check() -> dict[str, Any] | None:
        message = await s.message()
        return message if text in json.dumps(message["blocks"]) else None

    return await eventually(check, what=f"the message to say {text!r}")


# --- the message ---------------------------------------------------------------------------


async def test_a_move_needing_approval_posts_both_buttons(setup: Setup) -> None:
    rec, message = await waiting(setup)
    move_id = rec.move.move_id
    assert setup.world.names() == ["notify"]  # asked; nothing drained
    (actions,) = actions_of(message)
    assert [e["action_id"] for e in actions["elements"]] == ["approve", "reject"]
    for e in actions["elements"]:
        assert json.loads(e["value"]) == {"incident_id": move_id, "step": "move"}
        assert e["confirm"]["text"]["text"].endswith(f"move {move_id} of {rec.move.node}?")
    flat = json.dumps(message["blocks"])
    assert f"move `{move_id}`" in flat
    assert f"{UI}/namespaces/default/workflows/gpu-rebalance-{setup.r.cluster}" in flat
    assert "/v1/incidents/" not in flat  # a move is not an incident
    assert f"share approve {move_id}" in message["text"]


def test_an_incidents_card_is_not_a_moves() -> None:
    """Only the sharing workflow's notification gets the `move` step; an incident's keeps its
    rung, parsed as before."""
    common = {"cluster": "sandbox", "node": "gpu-01", "severity": "warning"}
    inc = Notification(
        incident_id="inc-1", fault="XID_79", event="approval_needed",
        text="reboot of gpu-01 needs approval by one of ['alice']", **common,
    )  # fmt: skip
    move = inc.model_copy(
        update={"incident_id": "sandbox-move-2", "fault": "gpu-rebalance", "text": "move?"}
    )
    assert IncidentCard.for_note(inc).apply(inc).waiting_step == "reboot"
    card = IncidentCard.for_note(move).apply(move)
    assert card.waiting_step == "move" and card.is_move
    fallback, blocks = card_message(card, Links())
    (block,) = [b for b in blocks if b["type"] == "actions"]
    assert block["block_id"] == "approval:move"
    # A move is shown as the feature's name; the old fault code stays in the payload only.
    assert blocks[0]["text"]["text"] == "GPU sharing on gpu-01"
    assert "GPU sharing on gpu-01" in fallback and "gpu-rebalance" not in json.dumps(blocks)
    _, inc_blocks = card_message(IncidentCard.for_note(inc).apply(inc), Links())
    assert inc_blocks[0]["text"]["text"] == "XID_79 on gpu-01"


# --- clicks ------------------------------------------------------------------------------


async def test_approve_click_lets_the_move_proceed_and_a_later_click_is_refused(
    setup: Setup,
) -> None:
    rec, message = await waiting(setup)
    move_id = rec.move.move_id
    answer = await setup.click(move_id, "approve", "U_ALICE")
    assert answer["status"] == 200, answer
    assert answer["body"]["outcome"] == "approved" and answer["body"]["approver"] == "alice"

    done = await finished(setup, move_id)
    assert (done.status, done.approved_by) == ("done", "alice")
    assert setup.world.names(move_id) == LEND_STEPS
    # The click marked the message decided at once; the move's end then rewrote it with
    # the outcome. Either way no button is left to click.
    decided = await outcome(setup, f"{rec.move.node} is now in inference, approved by alice")
    assert not actions_of(decided)
    assert f"move {move_id}" in decided["replies"][-1]["text"]

    # The same buttons clicked again (the old message, re-signed): refused with the reason.
    again = await setup.post(click_payload(message, "reject", "U_BOB"))
    body = again.json()
    assert again.status_code == 200 and body["outcome"] == "refused", body
    assert f"move {move_id} is not waiting for approval: done by alice" in body["reason"]
    (eph,) = await setup.ephemeral()
    assert eph["user"] == "U_BOB" and f"Could not reject move {move_id}" in eph["text"]
    after = await setup.status()
    assert [(m.status, m.approved_by) for m in after.moves] == [("done", "alice")]
    assert (await setup.message())["edits"] == decided["edits"]  # the message as it was


async def test_reject_click_stops_the_move(setup: Setup) -> None:
    rec, _ = await waiting(setup)
    move_id = rec.move.move_id
    answer = await setup.click(move_id, "reject", "U_BOB")  # an approver-group member
    assert answer["body"]["outcome"] == "rejected", answer
    done = await finished(setup, move_id)
    assert done.status == "rejected" and done.error == "rejected by bob"
    assert done.approved_by is None and done.steps == []
    assert set(setup.world.names()) == {"notify"}  # asked, told the outcome; nothing drained
    assert (await setup.status()).pools[rec.move.node] == Pool.TRAINING

    # The click's own mark ("Rejected by ...") and the move's outcome notice both update the
    # message, in either order under load; whichever lands last names bob's rejection and
    # leaves no button.
    async def told() -> dict[str, Any] | None:
        message = await setup.message()
        flat = json.dumps(message["blocks"])
        named = (
            "stays where it was: rejected by bob" in flat or "Rejected by <@U_BOB> (bob)" in flat
        )
        return message if named and not actions_of(message) else None

    await eventually(told, what="the message to name bob's rejection, without buttons")


async def test_a_move_nobody_approves_in_time_loses_its_buttons(setup: Setup) -> None:
    rec, _ = await waiting(setup)
    timeout = (await setup.status()).policy.approval_timeout_s
    # The time-skipping server: no real wait.
    await skip_time(setup.r.env, timedelta(seconds=timeout + 1))
    done = await finished(setup, rec.move.move_id)
    assert done.status == "rejected" and done.error == "nobody approved in time"
    told = await outcome(setup, "stays where it was: nobody approved in time")
    assert not actions_of(told)


async def test_unknown_forged_and_unauthorised_clicks_change_nothing(setup: Setup) -> None:
    rec, message = await waiting(setup)
    move_id = rec.move.move_id
    unknown = f"{setup.r.cluster}-move-99"
    value = json.dumps({"incident_id": unknown, "step": "move"}, separators=(",", ":"))
    resp = await setup.post(click_payload(message, "approve", "U_ALICE", value=value))
    assert resp.json()["outcome"] == "refused"
    assert f"no move {unknown} on cluster {setup.r.cluster}" in resp.json()["reason"]

    forged = await setup.post(click_payload(message, "approve", "U_ALICE"), secret="forged")
    assert forged.status_code == 401

    nobody = await setup.click(move_id, "approve", "U_MALLORY")  # not an approver
    assert nobody["body"]["outcome"] == "not_allowed"

    st = await setup.status()
    assert st.current is not None and st.current.status == "waiting_approval"
    assert st.current.move.move_id == move_id and setup.world.names() == ["notify"]
    still = await setup.message()
    assert actions_of(still) and still["edits"] == message["edits"]
    texts = [e["text"] for e in await setup.ephemeral()]
    assert len(texts) == 2 and "no move" in texts[0] and "not allowed" in texts[1]

    # Still decidable: the CLI's path (through the API, as the token's person) refuses an
    # unknown move, a reader's or an unknown token, and a claimed name, then decides.
    runner = CliRunner()
    cli_env = {
        "AUTOCLUSTERS_API_URL": setup.api_url,
        "AUTOCLUSTERS_API_TOKEN": CAROL,
        "AUTOCLUSTERS_CLUSTER": setup.r.cluster,
    }

    async def cli(*args: str, token: str = CAROL) -> Any:
        run_env = {**cli_env, "AUTOCLUSTERS_API_TOKEN": token}
        return await asyncio.to_thread(runner.invoke, share_app, list(args), env=run_env)

    out = await cli("approve", unknown)
    assert out.exit_code == 1, out.output
    assert "refused" in out.output and f"no move {unknown}" in out.output
    out = await cli("approve", move_id, token=READER)
    assert out.exit_code == 2 and "403" in out.output, out.output
    out = await cli("approve", move_id, token="nobodys-token-0123456789")
    assert out.exit_code == 2 and "401" in out.output, out.output
    out = await cli("approve", move_id, "--by", "alice")
    assert out.exit_code == 2 and "--by is gone" in out.output, out.output
    assert (await setup.status()).current == rec
    out = await cli("reject", move_id)
    assert out.exit_code == 0, out.output
    assert f"move {move_id} rejected by carol" in out.output
    done = await finished(setup, move_id)
    assert (done.status, done.error) == ("rejected", "rejected by carol")


# --- the update's validator ------------------------------------------------------------------


async def test_the_update_refuses_a_move_not_waiting(setup: Setup) -> None:
    rec, _ = await waiting(setup)
    move_id = rec.move.move_id
    client = setup.r.env.client

    cluster = setup.r.cluster

    async def refused(decision: MoveDecision) -> str:
        with pytest.raises(MoveRefused) as e:
            await decide_move(client, cluster, decision)
        return str(e.value)

    assert "needs the name" in await refused(signed_move(cluster, move_id, " "))
    assert "no proof of who decides" in await refused(
        MoveDecision(move_id=move_id, approve=True, by="dave")
    )
    with pytest.raises(WorkflowUpdateFailedError):  # the raw update refuses as well
        await setup.r.handle.execute_update(
            GpuSharing.decide_waiting_move, signed_move(cluster, "x", "a")
        )
    with pytest.raises(MoveRefused, match="GPU sharing is not running for cluster elsewhere"):
        await decide_move(client, "elsewhere", signed_move("elsewhere", move_id, "a"))
    assert (await setup.status()).current == rec  # none of that changed anything

    decided = await decide_move(
        client, cluster, signed_move(cluster, move_id, "dave", approve=False)
    )
    assert decided == "rejected"
    done = await finished(setup, move_id)
    assert done.error == "rejected by dave"
    reason = await refused(signed_move(cluster, move_id, "erin"))
    assert reason == f"move {move_id} is not waiting for approval: rejected (rejected by dave)"
    assert (await setup.status()).moves == [done]
