"""What a sandbox hardware fault does to the job, as it would on a GPU cluster.

`sandbox/machines/hardware.py` changes what the node's agent reads; an effect changes what the job's
processes on that node do:

- `crash`: the job's rank processes on the node exit at once (SIGKILL by PID), as a process
  does on an uncorrectable ECC error in use.
- `hang`: they stop (SIGSTOP) with their connections open, and every packet of those TCP
  connections is dropped (nftables, by the connection's pair of ports; a new connection's
  SYN to their listening ports too), so that a later SIGKILL sends no FIN/RST to their
  peers either: the peers block in their collective, as after an Xid 79.
- `lost`: the whole node vanishes: its slurmd stops (Slurm marks the node not responding
  after SlurmdTimeout), every process of its jobs (slurmstepd included) stops, and their
  connections go silent as in `hang`.
- `slow`: the ranks run 1/k of the time (a SIGSTOP/SIGCONT duty cycle run by the process
  `slow-<node>` of the sandbox's ProcessTable): each step takes about k times longer (the
  example job's idle "GPU work" counts only while its process runs). k is SLOW_FACTOR for
  a hardware fault, `--factor` for a silent one (sandbox/machines/job_faults.py).
- `none`: the agent's readings only.

Everything is lifted when the machine is rebooted or replaced (`lift`, called by
`sandbox/machines/backend.py` after `Hardware.repaired`; a silent fault's also once its processes
are gone, sandbox/machines/job_faults.py); what was stopped is SIGKILLed by its PID
when the machine powers off (`power_off`). Each sandbox's rules sit in an nftables table of
its own (`table_name`), created on demand and deleted at `sandbox down`; no other table is
ever touched, and every process is signalled by its PID and start time, never by name.

The job's processes on a node are found from /proc: the node's "machine" is the sessions of
processes holding its slurmd log or its spool dir open (slurmd, and every slurmstepd it
started: each keeps the node's slurmd log open), and of those, a job's processes carry
`SLURM_JOB_ID` in their environment; its ranks (a step's tasks and what they started,
not the batch script nor its `srun`) carry `SLURM_STEP_ID` too. This works for every job
(the in-job example, torchrun, the stand-in) without the job's help, never mistakes another
sandbox's node of the same name (its files are elsewhere), and needs no slurmd to answer
(`scontrol listpids` would, and a lost node's slurmd does not).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, Field

from autoclusters.core.process_start import start_ticks
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable, sessions_holding

Effect = Literal["crash", "hang", "lost", "slow", "none"]
EFFECTS: tuple[str, ...] = get_args(Effect)
SLOW_FACTOR = 3.0  # `slow`: a step takes about this many times longer
SLOW_PERIOD_S = 0.5  # one run+stop cycle of the duty cycle

# The realistic effect of each fault kind the project knows (core/faults.py, the agent's
# fake backend), as it shows to a job using the GPU or the link at the time.
DEFAULT_EFFECTS: dict[str, Effect] = {
    # The GPU is gone from under the process, or its driver/fabric stops answering: the
    # rank is stuck in the driver (often unkillable until a reboot), its peers wait.
    "XID_79": "hang",  # fallen off the bus
    "XID_48": "hang",  # double-bit ECC error in use
    "XID_74": "hang",  # NVLink error
    "XID_119": "hang",  # GSP RPC timeout
    "XID_120": "hang",  # GSP error
    "GPU_FELL_OFF_BUS": "hang",
    "GPU_DRIVER_UNRESPONSIVE": "hang",
    "GPU_COUNT_LOW": "hang",
    "NVLINK_DOWN": "hang",
    "FABRIC_NOT_READY": "hang",
    # An uncorrectable memory error the driver contains: CUDA returns an error and the
    # process using the memory exits.
    "ECC_DBE": "crash",
    "ROW_REMAP_FAILURE": "crash",
    "GPU_RECOVERY_ACTION": "crash",
    "XID_13": "crash",  # graphics engine exception
    "XID_31": "crash",  # MMU fault
    "XID_43": "crash",  # the channel was reset: the application's error
    "XID_64": "crash",  # row remap failure
    "XID_94": "crash",  # contained ECC error
    "XID_95": "crash",  # uncontained ECC error
    # The node's link to the others (or the node) is gone: nothing closes, nothing answers.
    "IB_LINK_DOWN": "lost",
    "HCA_FELL_OFF_BUS": "lost",
    "NODE_NOT_READY": "lost",
    # Throttled: the job goes on, slower.
    "THERMAL": "slow",
    "IB_LINK_DEGRADED": "slow",
    "NVLINK_ERRORS": "slow",
    # Silent faults (the agent finds them in the jobs' progress): a rank stops, or slows.
    "JOB_HANG": "hang",
    "SLOW_NODE": "slow",
    # Seen by the agent, not (yet) by the job.
    "ROW_REMAP_PENDING": "none",
    "PCIE_ERRORS": "none",
    "XID_63": "none",  # a row remap recorded
    "XID_92": "none",  # high single-bit ECC rate
    "MANUAL": "none",
}


def default_effect(fault: str) -> Effect:
    """The effect a fault kind has on a job in use, `none` for a kind not listed."""
    return DEFAULT_EFFECTS.get(fault, "none")


def parse_effect(value: str | None, fault: str) -> Effect:
    """`--effect`: one of EFFECTS, or None/"default" for the fault's realistic default."""
    if value in (None, "", "default"):
        return default_effect(fault)
    if value not in EFFECTS:
        raise ValueError(f"effect must be one of {', '.join(EFFECTS)} (or default), not {value!r}")
    return value  # type: ignore[return-value]


class Proc(BaseModel):
    pid: int
    ticks: int  # its start time: a reused PID is never signalled


class NodeEffect(BaseModel):
    """What an effect did to a node: undone (or finished off) at its reboot/replacement."""

    effect: Effect
    stopped: list[Proc] = Field(default_factory=list)
    # (local port, remote port) of each TCP socket of the stopped processes; remote port 0
    # for a listening one.
    connections: list[tuple[int, int]] = Field(default_factory=list)
    slurmd: Proc | None = None


# --- nftables ------------------------------------------------------------------------------


def table_name(cfg: SandboxConfig) -> str:
    """The sandbox's own nftables table: its port base and a hash of its state dir (tests run
    several sandboxes side by side)."""
    digest = hashlib.sha256(str(cfg.state_dir.resolve()).encode()).hexdigest()[:8]
    return f"autoclusters_sb_{cfg.port_base}_{digest}"


def chain_name(node: str, hook: str) -> str:
    return f"silence_{re.sub(r'[^A-Za-z0-9_]', '_', node)}_{hook}"


def render_silence(table: str, node: str, connections: Iterable[tuple[int, int]]) -> str:
    """An `nft -f` script: every TCP packet of one of `connections` ((local port, remote
    port) pairs) is dropped, either way, and so is every new connection's SYN to a listening
    one ((port, 0)), on the way in and out (on loopback each packet passes both), in the
    node's chains of `table`.

    By the pair of ports, not by port: the sandbox's nodes share one host and address, and
    connect() gives a new socket a port that a silenced one holds as long as the two go to
    different places, so a rule on the port alone could silence any new connection on the
    host until the node's repair (another sandbox's `sinfo` was seen stuck in SYN-SENT on
    one). A pair is one connection's until both of its ends are gone. A listener's port is
    no other socket's while it listens (connect() never takes a port bound by bind()): a
    SYN to it is for the vanished process, and gets no answer, as from a node that is gone
    (Slurm's step daemons waited ~60 s more on a lost batch host's `srun` when its kernel
    took their connections)."""
    connected = [(local, remote) for local, remote in connections if remote]
    pairs = {pair for local, remote in connected for pair in ((local, remote), (remote, local))}
    listening = sorted({local for local, remote in connections if not remote})
    if not pairs and not listening:
        return ""
    rules = []
    if pairs:
        pairs_set = "{ " + ", ".join(f"{a} . {b}" for a, b in sorted(pairs)) + " }"
        rules.append(f"tcp sport . tcp dport {pairs_set} drop")
    if listening:
        ports_set = "{ " + ", ".join(str(p) for p in listening) + " }"
        rules.append(f"tcp dport {ports_set} tcp flags & (syn | ack) == syn drop")
    lines = [f"add table inet {table}"]
    for hook in ("input", "output"):
        chain = chain_name(node, hook)
        lines.append(
            f"add chain inet {table} {chain} "
            f"{{ type filter hook {hook} priority -150; policy accept; }}"
        )
        lines += [f"add rule inet {table} {chain} {rule}" for rule in rules]
    return "\n".join(lines) + "\n"


def render_lift(table: str, node: str) -> str:
    """An `nft -f` script removing the node's chains (and their rules) from `table`."""
    lines = []
    for hook in ("input", "output"):
        chain = chain_name(node, hook)
        lines += [f"flush chain inet {table} {chain}", f"delete chain inet {table} {chain}"]
    return "\n".join(lines) + "\n"


def nft(*args: str, script: str | None = None, check: bool = True) -> str:
    exe = "nft" if _which("nft") else "/usr/sbin/nft"
    argv = [exe, *args] if script is None else [exe, "-f", "-"]
    done = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args) or '-f'} failed: {done.stderr.strip()}")
    return done.stdout


def _which(exe: str) -> bool:
    from shutil import which

    return which(exe) is not None


def table_rules(cfg: SandboxConfig) -> str | None:
    """The sandbox table as `nft list table` shows it; None when there is none."""
    done = subprocess.run(
        ["nft" if _which("nft") else "/usr/sbin/nft", "list", "table", "inet", table_name(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout if done.returncode == 0 else None


def _chains(listing: str) -> list[str]:
    return re.findall(r"^\s*chain (\S+) \{", listing, re.MULTILINE)


def delete_table(cfg: SandboxConfig) -> None:
    if table_rules(cfg) is not None:
        nft("delete", "table", "inet", table_name(cfg), check=False)


# --- the job's processes ------------------------------------------------------------------


def node_sessions(cfg: SandboxConfig, node: str) -> set[int]:
    """The sessions of the node's "machine": its slurmd and the slurmstepds it started (each
    keeps the node's slurmd log open; a batch step also its script in the spool dir)."""
    return sessions_holding(cfg.state_dir / "log" / f"slurmd-{node}.log") | sessions_holding(
        cfg.spool_dir / node
    )


def environ(pid: int) -> dict[str, str]:
    """A process's environment ({} once it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def machine_processes(cfg: SandboxConfig, node: str) -> list[tuple[int, dict[str, str]]]:
    sids = node_sessions(cfg, node)
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            if os.getsid(pid) not in sids:
                continue
        except ProcessLookupError:
            continue
        found.append((pid, environ(pid)))
    return found


def rank_processes(cfg: SandboxConfig, node: str, job_id: int | None = None) -> list[Proc]:
    """The processes of the job steps' tasks on the node (every job's, or `job_id`'s): what
    runs on its GPUs. Not the batch script, its `srun`s, nor slurmstepd."""
    out = []
    for pid, env in machine_processes(cfg, node):
        if "SLURM_JOB_ID" not in env or "SLURM_STEP_ID" not in env:
            continue
        if env.get("SLURMD_NODENAME", node) != node:
            continue
        # A standby launched into a holder job runs as the holder's step, on behalf of
        # the training job its launcher names (TRAIN_JOB_ID, examples/training HOLDERS=1).
        if job_id is not None and str(job_id) not in (env["SLURM_JOB_ID"], env.get("TRAIN_JOB_ID")):
            continue
        if (ticks := start_ticks(pid)) is not None:
            out.append(Proc(pid=pid, ticks=ticks))
    return out


def node_processes(cfg: SandboxConfig, node: str) -> list[Proc]:
    """Everything of the node's machine but its slurmd: slurmstepds and all their jobs'
    processes (the batch script and the job's own store included)."""
    slurmd = ProcessTable(cfg.state_dir).get(f"slurmd-{node}")
    out = []
    for pid, _ in machine_processes(cfg, node):
        if slurmd is not None and pid == slurmd.pid:
            continue
        if (ticks := start_ticks(pid)) is not None:
            out.append(Proc(pid=pid, ticks=ticks))
    return out


def signal_procs(procs: Iterable[Proc], sig: int) -> list[Proc]:
    """Signal each process that is still the one recorded; return those signalled."""
    done = []
    for p in procs:
        if start_ticks(p.pid) != p.ticks:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, sig)
            done.append(p)
    return done


def tcp_connections(procs: Iterable[Proc]) -> set[tuple[int, int]]:
    """(local port, remote port) of the processes' TCP sockets, remote port 0 for a
    listening one."""
    inodes: set[str] = set()
    tables: set[Path] = set()
    for p in procs:
        fd_dir = Path(f"/proc/{p.pid}/fd")
        try:
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[len("socket:[") : -1])
        except OSError:
            continue
        tables |= {Path(f"/proc/{p.pid}/net/tcp"), Path(f"/proc/{p.pid}/net/tcp6")}
    pairs: set[tuple[int, int]] = set()
    for table in tables:
        with contextlib.suppress(OSError):
            entries = parse_proc_net_tcp(table.read_text())
            pairs |= {(local, remote) for inode, local, remote in entries if inode in inodes}
    return pairs


def parse_proc_net_tcp(text: str) -> list[tuple[str, int, int]]:
    """(socket inode, local port, remote port) of each line of /proc/net/tcp or tcp6; the
    remote port is 0 for a listening socket."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1] or ":" not in fields[2]:
            continue
        local, remote = (int(f.rsplit(":", 1)[1], 16) for f in fields[1:3])
        out.append((fields[9], local, remote))
    return out


# --- applying and lifting ------------------------------------------------------------------


def _record_path(cfg: SandboxConfig, node: str) -> Path:
    return cfg.state_dir / "hardware" / f"{node}.effect.json"


def recorded(cfg: SandboxConfig, node: str) -> NodeEffect | None:
    try:
        return NodeEffect.model_validate_json(_record_path(cfg, node).read_text())
    except FileNotFoundError:
        return None


def _save(cfg: SandboxConfig, node: str, rec: NodeEffect) -> None:
    path = _record_path(cfg, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = recorded(cfg, node)
    if old is not None:  # a second fault on the machine adds to what the first did
        rec = NodeEffect(
            effect=rec.effect,
            stopped=[*old.stopped, *rec.stopped],
            connections=sorted({*old.connections, *rec.connections}),
            slurmd=rec.slurmd or old.slurmd,
        )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(rec.model_dump_json())
    tmp.replace(path)


def silence(cfg: SandboxConfig, node: str, connections: Iterable[tuple[int, int]]) -> None:
    script = render_silence(table_name(cfg), node, connections)
    if script:
        nft(script=script)


def apply(
    cfg: SandboxConfig,
    node: str,
    effect: Effect,
    *,
    job_id: int | None = None,
    factor: float = SLOW_FACTOR,
) -> NodeEffect:
    """Do `effect` to the node's jobs now; return what was done (also recorded). `factor`:
    how many times longer a step takes under `slow`."""
    rec = NodeEffect(effect=effect)
    if effect == "none":
        return rec
    if effect == "crash":
        signal_procs(rank_processes(cfg, node, job_id), signal.SIGKILL)
        return rec
    if effect == "slow":
        ranks = rank_processes(cfg, node, job_id)
        table = ProcessTable(cfg.state_dir)
        if ranks and not table.alive(slow_name(node)):
            argv = [sys.executable, "-m", "autoclusters.sandbox.machines.fault_effects", "slow",
                    str(factor), *(f"{p.pid}:{p.ticks}" for p in ranks)]  # fmt: skip
            table.spawn(slow_name(node), argv)
        _save(cfg, node, rec)
        return rec
    if effect == "hang":
        procs = signal_procs(rank_processes(cfg, node, job_id), signal.SIGSTOP)
    else:  # lost
        table = ProcessTable(cfg.state_dir)
        slurmd = table.get(f"slurmd-{node}")
        if slurmd is not None:
            stopped = signal_procs([Proc(pid=slurmd.pid, ticks=slurmd.start_ticks)], signal.SIGSTOP)
            rec.slurmd = stopped[0] if stopped else None
        procs = signal_procs(node_processes(cfg, node), signal.SIGSTOP)
    _wait_stopped(procs)
    rec.stopped = procs
    rec.connections = sorted(tcp_connections(procs))
    _save(cfg, node, rec)  # before the rules: a crash in between leaves them to be lifted
    silence(cfg, node, rec.connections)
    return rec


def inject(
    cfg: SandboxConfig,
    node: str,
    vm_id: str,
    fault: HardwareFault,
    effect: Effect,
    *,
    job_id: int | None = None,
) -> NodeEffect:
    """A hardware fault on the node's machine: its effect on the jobs first (on a GPU the
    job fails as the driver logs the Xid), then what the node's agent reads, stamped when
    the fault struck: the driver logs the Xid as the job fails, not once this emulation
    has finished stopping the ranks (up to seconds on a loaded host)."""
    struck = datetime.now(UTC)
    done = apply(cfg, node, effect, job_id=job_id)
    Hardware(cfg.state_dir).inject(node, vm_id, fault, at=struck)
    return done


def _wait_stopped(procs: list[Proc], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(_state(p.pid) in ("T", "t", None) for p in procs):
            return
        time.sleep(0.01)


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def power_off(cfg: SandboxConfig, node: str) -> None:
    """The machine goes down: what an effect stopped is SIGKILLed by its PID (a stopped
    slurmd would wait out the table's SIGTERM first; a stopped step may hold no file of the
    node's that the power-off's session search finds), and so is the duty cycle."""
    table = ProcessTable(cfg.state_dir)
    table.stop(slow_name(node))
    table.stop(release_name(node))
    rec = recorded(cfg, node)
    if rec is None:
        return
    if rec.slurmd is not None and start_ticks(rec.slurmd.pid) == rec.slurmd.ticks:
        ProcessTable(cfg.state_dir).kill(f"slurmd-{node}")
    killed = signal_procs(youngest_first(rec.stopped), signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(start_ticks(p.pid) == p.ticks for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)


def youngest_first(procs: Iterable[Proc]) -> list[Proc]:
    """Children before their parents (a child starts after its parent). Killed parent
    first, a stopped child whose process group the parent's death orphans gets SIGHUP and
    SIGCONT from the kernel and runs before its own SIGKILL lands: a lost node's `srun`
    woke so, said "forcing job termination" and asked slurmctld to kill step 0 of its job,
    which had just been requeued and allocated elsewhere (its new run's step 0)."""
    return sorted(procs, key=lambda p: (p.ticks, p.pid), reverse=True)


def lift(cfg: SandboxConfig, node: str) -> None:
    """The machine was rebooted or replaced: its processes are gone (power_off), its chains
    go from the sandbox's table, and the table goes when no node has any left."""
    power_off(cfg, node)  # idempotent: anything still recorded is gone first
    unsilence(cfg, node)


def unsilence(cfg: SandboxConfig, node: str) -> None:
    """The node's record and chains go (its processes are gone), and the sandbox's table
    when no node has any left."""
    _record_path(cfg, node).unlink(missing_ok=True)
    listing = table_rules(cfg)
    if listing is None:
        return
    mine = {chain_name(node, "input"), chain_name(node, "output")}
    chains = _chains(listing)
    if mine & set(chains):
        nft(script=render_lift(table_name(cfg), node), check=False)
    if not set(chains) - mine:
        delete_table(cfg)


def down(cfg: SandboxConfig) -> None:
    """`sandbox down`: every node's effect ends (stopped slurmds killed first, so that the
    table's stop of them does not wait), and the sandbox's table goes."""
    hw = cfg.state_dir / "hardware"
    for path in sorted(hw.glob("*.effect.json")) if hw.exists() else []:
        power_off(cfg, path.name.removesuffix(".effect.json"))
        path.unlink(missing_ok=True)
    delete_table(cfg)


def slow_name(node: str) -> str:
    return f"slow-{node}"


def release_name(node: str) -> str:
    """The process that lifts a silent hang once its processes are gone (job_faults.py)."""
    return f"release-{node}"


# --- the duty cycle (`slow`) ---------------------------------------------------------------


def duty_cycle(procs: list[Proc], factor: float, period_s: float = SLOW_PERIOD_S) -> None:
    """Run the processes 1/factor of each period, stopped the rest, until none is left or
    SIGTERM (which lets them run on)."""
    done = False

    def stop(*_: object) -> None:
        nonlocal done
        done = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    run_s = period_s / max(factor, 1.0)
    try:
        while not done and any(start_ticks(p.pid) == p.ticks for p in procs):
            signal_procs(procs, signal.SIGCONT)
            time.sleep(run_s)
            if done:
                break
            signal_procs(procs, signal.SIGSTOP)
            time.sleep(period_s - run_s)
    finally:
        signal_procs(procs, signal.SIGCONT)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "slow":
        procs = []
        for item in argv[2:]:
            pid, _, ticks = item.partition(":")
            procs.append(Proc(pid=int(pid), ticks=int(ticks)))
        duty_cycle(procs, float(argv[1]))
        return 0
    print("usage: python -m autoclusters.sandbox.machines.fault_effects slow FACTOR PID:TICKS...")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
