"""The fake node's live values: load, temperature, power, memory and traffic that move.

The fake file holds what a fault changes (ECC counts, link states, Xids); a dashboard also
wants what a busy GPU shows, and a Prometheus pipeline wants counters that grow. Those are
computed here from the time alone, so they are deterministic (the same `t` gives the same
values, which tests rely on) yet change from one scrape to the next:

- utilisation follows a 10-minute sine, phase-shifted per GPU;
- power follows the load, and so does the temperature of a GPU whose file value is the
  healthy idle one (40 C -> at most ~64 C, well below the agent's warning margin); a
  temperature a fault or a test wrote into the file is shown exactly as written;
- memory used follows a slower wave;
- energy, NVLink and InfiniBand traffic are the exact integrals of their rates since
  `since` (the fake backend passes the moment it was made: a restarted agent is a driver
  reload, its counters start again from 0, which Prometheus's rate() handles), so they only
  ever increase.

A lost GPU, and an InfiniBand port that is not ACTIVE, get nothing: they carry no traffic
and a lost GPU answers nothing.
"""

from __future__ import annotations

import math

from autoclusters.clients.agent.readings import GpuReadings, IbReadings, state_number

MODEL = "NVIDIA H200"
FB_TOTAL_MIB = 143_771  # what nvidia-smi shows for an H200
PERIOD_S = 600.0
IDLE_W, W_PER_PERCENT = 90.0, 6.1  # ~700 W at full load, an H200 SXM's TDP
NVLINK_KIB_PER_S_PER_PERCENT = 4_000_000  # ~400 GB/s of NVLink traffic at full load
IB_WORDS_PER_S = 5e9 / 4  # sysfs data counters count 4-octet words; ~5 GB/s a port
IB_BYTES_PER_PACKET = 4096
IB_ACTIVE = 4
IDLE_TEMP_C = 40  # the healthy file's temperature

_W = 2 * math.pi / PERIOD_S
_MEAN, _AMP = 50.0, 45.0  # utilisation percent: 5..95


def _phase(index: int) -> float:
    return 0.7 * index


def utilization(t: float, index: int) -> float:
    return _MEAN + _AMP * math.sin(_W * t + _phase(index))


def _load_integral(t: float, since: float, index: int) -> float:
    """The integral of utilisation from `since` to t (percent-seconds); increasing in t."""
    p = _phase(index)
    return _MEAN * (t - since) - _AMP / _W * (math.cos(_W * t + p) - math.cos(_W * since + p))


def animate_gpus(readings: GpuReadings, t: float, since: float) -> None:
    """Fill the live fields of every GPU that answers, in place."""
    for g in readings.gpus:
        if g.lost:
            continue
        util = utilization(t, g.index)
        g.name = g.name or MODEL
        g.utilization_gpu = round(util)
        g.power_w = round(IDLE_W + W_PER_PERCENT * util, 3)
        if g.temperature_c == IDLE_TEMP_C:
            g.temperature_c += round(util / 4)
        base = _load_integral(t, since, g.index)
        g.energy_mj = int(1000 * (IDLE_W * (t - since) + W_PER_PERCENT * base))
        slow = 0.5 + 0.4 * math.sin(_W / 3 * t + _phase(g.index))
        g.fb_used_mib = int(FB_TOTAL_MIB * slow)
        g.fb_free_mib = FB_TOTAL_MIB - g.fb_used_mib
        if any(link.active for link in g.nvlinks.values()):
            g.nvlink_bandwidth_kib = int(NVLINK_KIB_PER_S_PER_PERCENT * base)


def animate_ib(ib: IbReadings | None, t: float, since: float) -> None:
    """Traffic counters on every ACTIVE port (sysfs names), in place."""
    if ib is None:
        return
    for n, p in enumerate(ib.ports):
        if state_number(p.state) != IB_ACTIVE:
            continue
        words = int(IB_WORDS_PER_S * _load_integral(t, since, n) / _MEAN)
        packets = words * 4 // IB_BYTES_PER_PACKET
        for name, value in (
            ("port_xmit_data", words), ("port_rcv_data", words),
            ("port_xmit_packets", packets), ("port_rcv_packets", packets),
        ):  # fmt: skip
            p.counters.setdefault(name, value)
