"""InfiniBand (and RoCE) adapters from sysfs: `<root>/class/infiniband/<hca>/ports/<n>/`.

Per port: `state` ("4: ACTIVE"), `phys_state` ("5: LinkUp"), `rate` ("400 Gb/sec (4X NDR)"),
`link_layer`, and the IBTA counters in `counters/` (link_downed, symbol_error, ...).
The root is a setting (normally /sys) so tests read a tree built under tmp_path.

Reading never raises for a missing or unreadable file: adapters can vanish mid-read (that
is the HCA_FELL_OFF_BUS case); what could not be read is listed in `IbReadings.errors`.
"""

from __future__ import annotations

from pathlib import Path

from autoclusters.clients.agent.readings import IbPortReading, IbReadings


class SysfsInfiniband:
    def __init__(self, root: Path | str = "/sys") -> None:
        self.root = Path(root)

    @property
    def class_dir(self) -> Path:
        return self.root / "class" / "infiniband"

    def read(self) -> IbReadings | None:
        """The adapters now present; None when this machine has no InfiniBand class at all."""
        if not self.class_dir.is_dir():
            return None
        out = IbReadings()
        try:
            hcas = sorted(p.name for p in self.class_dir.iterdir())
        except OSError as e:
            out.errors[str(self.class_dir)] = str(e)
            return out
        for hca in hcas:
            ports_dir = self.class_dir / hca / "ports"
            try:
                ports = sorted((p for p in ports_dir.iterdir() if p.name.isdigit()), key=_num)
            except OSError as e:
                out.errors[str(ports_dir)] = str(e)
                continue  # gone while we read: not present now
            out.hcas.append(hca)
            for port_dir in ports:
                out.ports.append(self._port(hca, port_dir, out.errors))
        return out

    def _port(self, hca: str, d: Path, errors: dict[str, str]) -> IbPortReading:
        port = IbPortReading(hca=hca, port=int(d.name))
        for attr in ("state", "phys_state", "rate", "link_layer"):
            setattr(port, attr, _read(d / attr, errors))
        counters = d / "counters"
        try:
            names = sorted(p.name for p in counters.iterdir())
        except OSError:
            names = []
        for name in names:
            text = _read(counters / name, errors)
            if text.isdigit():
                port.counters[name] = int(text)
        return port


def _num(p: Path) -> int:
    return int(p.name)


def _read(path: Path, errors: dict[str, str]) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        errors[str(path)] = e.strerror or str(e)
        return ""
