"""Slurm reservations and a job in one: what the burn-in screen adds to `SlurmCli`.

A breakfix reservation holds a repaired node (and the neighbour it is screened with) for
the screen's job alone: `scontrol create reservation ... Flags=MAINT,IGNORE_JOBS` with a
duration, so a reservation whose delete was lost still ends. Reads are `scontrol -o show
reservation`: one line per reservation, "No reservations in the system" when there are
none; a read that failed raises SlurmUnavailable (unknown is not "absent").
"""

from __future__ import annotations

import math
import shlex

from autoclusters.integrations.slurm import SlurmCli, SlurmUnavailable

NO_RESERVATIONS = "No reservations in the system"


def parse_reservations(text: str) -> dict[str, dict[str, str]]:
    """`scontrol -o show reservation`'s lines, by name: each field as Slurm printed it."""
    if text.strip().startswith(NO_RESERVATIONS):
        return {}
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields = dict(part.split("=", 1) for part in shlex.split(line) if "=" in part)
        if "ReservationName" in fields:
            out[fields["ReservationName"]] = fields
    if not out and text.strip():
        raise SlurmUnavailable(f"scontrol show reservation printed no reservation: {text[:200]!r}")
    return out


class SlurmReservationCli(SlurmCli):
    """SlurmCli with reservations and a batch job placed in one."""

    async def reservations(self) -> dict[str, dict[str, str]]:
        out = await self._run("scontrol", "-o", "show", "reservation", read=True)
        if not out.strip():
            raise SlurmUnavailable("scontrol show reservation printed nothing")
        return parse_reservations(out)

    async def reservation(self, name: str) -> dict[str, str] | None:
        return (await self.reservations()).get(name)

    async def create_reservation(
        self, name: str, nodes: list[str], user: str, duration_s: float
    ) -> None:
        minutes = max(1, math.ceil(duration_s / 60))
        await self._run(
            "scontrol", "create", "reservation", f"ReservationName={name}",
            f"Nodes={','.join(nodes)}", "StartTime=now", f"Duration={minutes}",
            f"Users={user}", "Flags=MAINT,IGNORE_JOBS",
        )  # fmt: skip

    async def delete_reservation(self, name: str) -> None:
        await self._run("scontrol", "delete", f"ReservationName={name}")

    async def submit_in_reservation(
        self,
        command: str,
        *,
        name: str,
        reservation: str,
        nodes: list[str],
        ntasks_per_node: int,
        output: str,
        time_limit_s: float,
        comment: str = "",
    ) -> int:
        """`sbatch --wrap` in `reservation`, on exactly `nodes`; the job's id."""
        argv = [
            "sbatch", "--parsable", f"--job-name={name}", f"--reservation={reservation}",
            f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
            f"--ntasks-per-node={ntasks_per_node}", f"--output={output}",
            f"--time={max(1, math.ceil(time_limit_s / 60))}",
            "--no-requeue",  # a screen that lost its node failed: never rerun it quietly
        ]  # fmt: skip
        if comment:
            argv.append(f"--comment={comment}")
        out = await self._run(*argv, f"--wrap={command}")
        return int(out.strip().split(";")[0])
