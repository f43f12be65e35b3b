"""One sandbox's Managed Slurm cluster as real local daemons: the Crusoe emulator's sandbox
backend calls this when the API creates, configures or deletes a cluster.

Each daemon runs in the foreground under its own config in the sandbox's state dir and is
recorded in its ProcessTable (`sandbox down` stops it by PID), never as a system service:
  mariadb     private datadir and socket, loopback port          (accounting only)
  slurmdbd    reads dirname($SLURM_CONF)/slurmdbd.conf            (accounting only)
  slurmctld   the same name and argv as `sandbox up` gave it, so restart and chaos work
  sshd-login  the login endpoint: root by key, SLURM_CONF set in every session
Slurm 22.05's slurmctld refuses to start with no nodes, so it starts at the first
configuration that lists some (until then the cluster reports `controller_state` null).
The blocking calls here run in a thread (the emulator's loop stays free).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from autoclusters.sandbox.crusoe.slurm_models import ClusterStarted, SlurmConfiguration, SlurmUser
from autoclusters.sandbox.runtime import daemons, port_holders
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable, wait_until
from autoclusters.sandbox.slurm.files import Layout, NodeDef, render_gres_conf, render_slurm_conf

MARIADB, SLURMDBD, SLURMCTLD, LOGIN = "mariadb", "slurmdbd", "slurmctld", "sshd-login"
RUNNING = "STATE_RUNNING"
HEADER = "Written by the Crusoe emulator's Managed Slurm (sandbox backend)"


class ManagedSlurm:
    def __init__(
        self,
        cfg: SandboxConfig,
        power_on: Callable[[SandboxConfig, str], None],
        timeout_s: float = 60.0,
    ) -> None:
        self.cfg = cfg
        self.power_on = power_on  # a machine's slurmd (sandbox.machines.backend.power_on)
        self.table = ProcessTable(cfg.state_dir)
        self.timeout_s = timeout_s
        self.slurm_dir = cfg.slurm_conf.parent
        self.db_dir = cfg.state_dir / "mariadb"
        self.login_dir = cfg.state_dir / "login"
        self.owner_file = self.slurm_dir / "managed-cluster.json"

    # --- the API's verbs ------------------------------------------------------------------

    def create(self, cluster_id: str, accounting: bool, root_keys: list[str]) -> ClusterStarted:
        owner = self._owner()
        if owner and owner.get("id") != cluster_id:
            raise RuntimeError(f"this sandbox already runs Slurm cluster {owner.get('id')}")
        self.prepare(accounting)
        self.owner_file.write_text(json.dumps({"id": cluster_id, "accounting": accounting}))
        if accounting:
            self.start_accounting()
        self.start_login(root_keys)
        return self._report(accounting)

    def configure(
        self, config: SlurmConfiguration, accounting: bool, running: list[str]
    ) -> ClusterStarted:
        ports = self.ports(config.nodes())
        gpus = {n: s.gpus_per_node for s in config.node_sets for n in s.nodes}
        nodes = [NodeDef(n, ports[n], gpus[n], config.drained.get(n)) for n in config.nodes()]
        partitions: dict[str, list[str]] = {}
        for s in config.node_sets:
            partitions.setdefault(s.partition, []).extend(s.nodes)
        layout = Layout(
            nodes=nodes,
            partitions=partitions,
            accounting=accounting,
            topology=bool(config.topology_conf.strip()),
            header=HEADER,
        )
        self.apply(layout, config.topology_conf, running)
        return self._report(accounting)

    # --- the pieces, shared with the emulated Slinky kubelet (sandbox/slinky/kubelet.py) ----

    def prepare(self, accounting: bool, header: str = HEADER) -> None:
        """munged answers, the directories exist, and clients (sacctmgr, sbatch) find a
        slurm.conf even before there are nodes."""
        if not daemons.munge_ready(self.cfg):
            raise RuntimeError(f"munged is not answering on {self.cfg.munge_socket}")
        for d in (self.slurm_dir / "ctld", self.cfg.log_dir, self.cfg.state_dir / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        if not self.table.alive(SLURMCTLD):
            self.write_conf(Layout(nodes=[], partitions={}, accounting=accounting, header=header))

    def start_accounting(self) -> None:
        """MariaDB, slurmdbd on it, and the cluster in its database."""
        self._start_mariadb()
        self._start_slurmdbd()
        self._sacctmgr("add", "cluster", self.cfg.cluster)

    def stop_accounting(self) -> list[str]:
        return [n for n in (SLURMDBD, MARIADB) if self.table.stop(n)]

    def apply(self, layout: Layout, topology_conf: str, running: list[str]) -> None:
        """Write the layout's slurm.conf (and gres.conf, topology.conf) and make slurmctld
        follow it: started the first time, restarted when the node list changed (22.05
        reads it only at start), else told to reconfigure. Then each node of `running`
        gets its slurmd (`power_on`)."""
        nodes = layout.nodes
        for i in range(max([n.gpus for n in nodes] or [0])):
            (self.cfg.state_dir / "dev" / f"nvidia{i}").touch()
        before = self.declared()
        self.write_conf(layout, topology_conf)
        after = {n.name: n.port for n in nodes}
        (self.slurm_dir / "declared.json").write_text(json.dumps(after))
        if not nodes:
            self.table.stop(SLURMCTLD)  # 22.05 cannot run without nodes
            return
        self.cfg.spool_dir.mkdir(parents=True, exist_ok=True)
        if not self.table.alive(SLURMCTLD):
            # -c (a fresh controller: no jobs of an earlier cluster) only the first time.
            argv = daemons.slurmctld_argv(self.cfg)
            if before:
                argv = [a for a in argv if a != "-c"]
            self._start(SLURMCTLD, argv, daemons.slurm_env(self.cfg), self._slurmctld_up)
        elif before != after:
            # New or removed nodes: slurmctld 22.05 reads the node list only at start.
            self.table.stop(SLURMCTLD)
            argv = [a for a in daemons.slurmctld_argv(self.cfg) if a != "-c"]
            self._start(SLURMCTLD, argv, daemons.slurm_env(self.cfg), self._slurmctld_up)
            self._scontrol("reconfigure")  # running slurmds re-read the node list
        else:
            self._scontrol("reconfigure")
        for node in nodes:
            if node.name in running:
                self.power_on(self.cfg, node.name)

    def add_user(self, user: SlurmUser, accounting: bool) -> None:
        keys = self.login_dir / "keys"
        keys.mkdir(parents=True, exist_ok=True)
        (keys / user.name).write_text("".join(k.strip() + "\n" for k in user.ssh_public_keys))
        if accounting:
            account = user.slurm_account or "users"
            self._sacctmgr("add", "account", account, f"cluster={self.cfg.cluster}")
            self._sacctmgr("add", "user", user.name, f"account={account}")

    def delete(self) -> list[str]:
        """Stop the cluster's daemons by PID (not the machines' slurmd: the VMs go first)."""
        stopped = [n for n in (LOGIN, SLURMCTLD, SLURMDBD, MARIADB) if self.table.stop(n)]
        forget(self.cfg)
        return stopped

    # --- state ----------------------------------------------------------------------------

    def _owner(self) -> dict[str, object]:
        try:
            doc: dict[str, object] = json.loads(self.owner_file.read_text())
            return doc
        except FileNotFoundError:
            return {}

    def declared(self) -> dict[str, int]:
        """The nodes slurm.conf declares now, with their slurmd ports."""
        try:
            doc: dict[str, int] = json.loads((self.slurm_dir / "declared.json").read_text())
            return doc
        except FileNotFoundError:
            return {}

    def ports(self, nodes: list[str]) -> dict[str, int]:
        """Each node's slurmd port, stable across configurations: the static layout's
        (`cfg.slurmd_port(i)` for gpu-0{i+1}) when free, else the lowest free index."""
        path = self.slurm_dir / "node-ports.json"
        try:
            index: dict[str, int] = json.loads(path.read_text())
        except FileNotFoundError:
            index = {}
        static = {name: i for i, name in enumerate(self.cfg.node_names())}
        for node in nodes:
            if node in index:
                continue
            taken = set(index.values())
            want = static.get(node)
            if want is None or want in taken:
                want = next(i for i in range(len(static), 10_000) if i not in taken)
            index[node] = want
        path.write_text(json.dumps(index))
        return {n: self.cfg.slurmd_port(index[n]) for n in nodes}

    def write_conf(self, layout: Layout, topology_conf: str = "") -> None:
        self.slurm_dir.mkdir(parents=True, exist_ok=True)
        _write(self.cfg.slurm_conf, render_slurm_conf(self.cfg, layout))
        _write(self.slurm_dir / "gres.conf", render_gres_conf(self.cfg, layout.nodes))
        _write(self.slurm_dir / "topology.conf", topology_conf)

    def _report(self, accounting: bool) -> ClusterStarted:
        login = f"127.0.0.1:{self.cfg.login_port}" if ssh_answers(self.cfg.login_port) else ""
        dbd = accounting and self.table.alive(SLURMDBD)
        return ClusterStarted(
            login_node_endpoint=login,
            accounting_state=RUNNING if dbd else None,
            controller_state=RUNNING if self.table.alive(SLURMCTLD) else None,
        )

    # --- daemons --------------------------------------------------------------------------

    def _start(
        self, name: str, argv: list[str], env: dict[str, str], ready: Callable[[], bool]
    ) -> None:
        if self.table.alive(name):
            return
        self.table.spawn(name, argv, env)

        def ok() -> bool:
            if not self.table.alive(name):
                raise RuntimeError(f"{name} exited: {self.table.log_tail(name, 8)}")
            return ready()

        if not wait_until(ok, self.timeout_s, 0.1):
            raise RuntimeError(f"{name} not ready after {self.timeout_s:.0f}s")

    def _start_mariadb(self) -> None:
        data = self.db_dir / "data"
        # Its own temporary directory: sandboxes installing side by side (parallel tests)
        # shared /tmp, and one bootstrap failed on a temporary table another had removed.
        tmp = self.db_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        if not data.exists():
            _run([
                daemons.require("mariadb-install-db"), "--no-defaults", f"--datadir={data}",
                "--auth-root-authentication-method=normal", "--user=root", f"--tmpdir={tmp}",
            ])  # fmt: skip
        argv = [
            daemons.require("mariadbd"), "--no-defaults", f"--datadir={data}", f"--tmpdir={tmp}",
            f"--socket={self._db_socket}", f"--port={self.cfg.mariadb_port}",
            "--bind-address=127.0.0.1", "--skip-name-resolve",
            f"--pid-file={self.db_dir / 'mariadbd.pid'}",
            f"--log-error={self.cfg.log_dir / 'mariadbd.log'}", "--user=root",
        ]  # fmt: skip
        self._start(MARIADB, argv, {}, self._db_up)
        # slurmdbd connects over TCP (a socket path is not in slurmdbd.conf's vocabulary).
        self._sql(
            "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1'; "
            "GRANT ALL PRIVILEGES ON *.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
        )

    @property
    def _db_socket(self) -> Path:
        return self.db_dir / "db.sock"

    def _db_up(self) -> bool:
        r = subprocess.run(
            [daemons.require("mariadb-admin"), "--no-defaults", "-S", str(self._db_socket),
             "-uroot", "ping"],
            capture_output=True, timeout=10,
        )  # fmt: skip
        return r.returncode == 0

    def _sql(self, statements: str) -> None:
        _run([daemons.require("mariadb"), "--no-defaults", "-S", str(self._db_socket), "-uroot",
              "-e", statements])  # fmt: skip

    def _start_slurmdbd(self) -> None:
        conf = self.slurm_dir / "slurmdbd.conf"
        _write(conf, self._slurmdbd_conf(), mode=0o600)
        argv = [daemons.require("slurmdbd"), "-D"]
        port = self.cfg.slurmdbd_port
        self._start(SLURMDBD, argv, daemons.slurm_env(self.cfg), lambda: daemons.port_open(port))

    def _slurmdbd_conf(self) -> str:
        # slurmdbd 22.05 reads dirname($SLURM_CONF)/slurmdbd.conf: no -f, no SLURMDBD_CONF.
        d, cfg = self.cfg.state_dir, self.cfg
        return f"""\
# {HEADER}.
AuthType=auth/munge
AuthInfo=socket={cfg.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={cfg.slurmdbd_port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={cfg.mariadb_port}
StorageUser=slurm
StorageLoc=slurm_acct_db
PidFile={d}/slurm/slurmdbd.pid
LogFile={cfg.log_dir}/slurmdbd.log
DebugLevel=info
"""

    def start_login(self, root_keys: list[str]) -> None:
        keys = self.login_dir / "keys"
        keys.mkdir(parents=True, exist_ok=True)
        (keys / "root").write_text("".join(k.strip() + "\n" for k in root_keys))
        host_key = self.login_dir / "ssh_host_ed25519_key"
        if not host_key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sandbox-login",
                  "-f", str(host_key)])  # fmt: skip
        _write(self.login_dir / "sshd_config", self._sshd_config(host_key, keys))
        # sshd insists on its privilege-separation directory (compiled in).
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        argv = [
            daemons.require("sshd"), "-D", "-f", str(self.login_dir / "sshd_config"),
            "-E", str(self.cfg.log_dir / "sshd-login.log"),
        ]  # fmt: skip
        port = self.cfg.login_port
        self._start(LOGIN, argv, {}, lambda: ssh_answers(port))

    def _sshd_config(self, host_key: Path, keys: Path) -> str:
        return f"""\
# {HEADER}: the cluster's login endpoint.
Port {self.cfg.login_port}
ListenAddress 127.0.0.1
HostKey {host_key}
PidFile {self.login_dir / "sshd.pid"}
AuthorizedKeysFile {keys}/%u
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
SetEnv SLURM_CONF={self.cfg.slurm_conf}
"""

    # --- Slurm clients --------------------------------------------------------------------

    def _slurmctld_up(self) -> bool:
        """The slurmctld just started answers: asked only once it listens on its port
        itself. Another process holding the port may accept a ping and never answer it
        (scontrol then waits out its MessageTimeout, 10 s, before this sees the controller
        exit for want of the port)."""
        rec = self.table.get(SLURMCTLD)
        return (
            rec is not None
            and port_holders.listens(rec.pid, self.cfg.slurmctld_port)
            and self.controller_up()
        )

    def controller_up(self) -> bool:
        r = subprocess.run(
            [daemons.require("scontrol"), "ping"],
            env={**os.environ, **daemons.slurm_env(self.cfg)},
            capture_output=True,
            text=True,
            timeout=15,
        )
        return "UP" in r.stdout

    def _scontrol(self, *args: str) -> None:
        _run([daemons.require("scontrol"), *args], daemons.slurm_env(self.cfg))

    def _sacctmgr(self, *args: str) -> None:
        argv = [daemons.require("sacctmgr"), "-i", *args]
        r = subprocess.run(
            argv,
            env={**os.environ, **daemons.slurm_env(self.cfg)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        said = r.stdout + r.stderr
        if r.returncode != 0 and "Nothing new added" not in said and "already exists" not in said:
            raise RuntimeError(f"sacctmgr {' '.join(args)}: {said.strip()}")


def forget(cfg: SandboxConfig) -> None:
    """No Slurm cluster here any more: one created later is a new one, and none of the old
    one's nodes (their drain reasons), jobs or accounting records come back with it. Also
    what a fresh `sandbox up` does (its emulator starts with an empty world)."""
    probe = ManagedSlurm(cfg, lambda _cfg, _node: None)
    (probe.slurm_dir / "declared.json").unlink(missing_ok=True)
    shutil.rmtree(probe.slurm_dir / "ctld", ignore_errors=True)
    shutil.rmtree(probe.db_dir / "data", ignore_errors=True)
    probe.owner_file.unlink(missing_ok=True)


def _run(argv: list[str], env: dict[str, str] | None = None) -> None:
    r = subprocess.run(
        argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60
    )
    if r.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed: {(r.stdout + r.stderr).strip()}")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


def ssh_answers(port: int) -> bool:
    """sshd's banner: the endpoint takes logins (a bound port alone is not enough)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False
