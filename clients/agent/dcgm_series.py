"""GPU readings as the series dcgm-exporter exports, with its names and labels.

Names are DCGM's field names as dcgm-exporter writes them (etc/default-counters.csv, plus
the ECC, NVLink-error and row-remap-pending fields it ships commented out, and its computed
DCGM_EXP_XID_ERRORS_COUNT), so dashboards and alert rules written for dcgm-exporter work
unchanged. Labels are dcgm-exporter's for a whole GPU: gpu, UUID, pci_bus_id, device
(nvidia<N>), modelName, Hostname (the node's name here; the API takes the node from it).

DCGM_FI_DEV_XID_ERRORS is the last Xid seen on the GPU (0 before any) with `err_code`, as
dcgm-exporter labels it. DCGM_EXP_XID_ERRORS_COUNT counts each Xid in a trailing window,
labelled `xid` and `window_size_in_ms`; a GPU without an Xid in the window has no series.

A reading that is None (unsupported, or the call failed) is left out, never written as 0.
A lost GPU has no series at all, as under dcgm-exporter, which is what the GpuMissing
rule counts on. DCGM's counter fields (names without `_total`) are written untyped:
prometheus-client would otherwise append `_total` to their TYPE line; the series names,
which are what PromQL sees, are exactly dcgm-exporter's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from autoclusters.clients.agent.readings import GpuReading, GpuReadings

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
Value = Callable[[GpuReading], float | int | None]


def _rows(attr: str) -> Value:
    def get(g: GpuReading) -> float | int | None:
        return None if g.remapped_rows is None else int(getattr(g.remapped_rows, attr))

    return get


def _nvlink(counter: str) -> Value:
    """DCGM's *_TOTAL NVLink fields: the sum over the GPU's links of one NVML counter."""

    def get(g: GpuReading) -> float | int | None:
        counts = [r.errors[counter] for r in g.nvlinks.values() if counter in r.errors]
        return sum(counts) if counts else None

    return get


# (field, type as dcgm-exporter declares it, help, value)
FIELDS: list[tuple[str, str, str, Value]] = [
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: g.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: g.power_w),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).", lambda g: g.energy_mj),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
     lambda g: g.pcie_replay_counter),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: g.utilization_gpu),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
     lambda g: g.fb_free_mib),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
     lambda g: g.fb_used_mib),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
     "Total number of single-bit volatile ECC errors.", lambda g: g.ecc_corrected_volatile),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
     "Total number of double-bit volatile ECC errors.", lambda g: g.ecc_uncorrected_volatile),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
     "Total number of NVLink flow-control CRC errors.", _nvlink("crc_flit")),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
     "Total number of NVLink data CRC errors.", _nvlink("crc_data")),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter",
     "Total number of NVLink retries.", _nvlink("replay")),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
     "Total number of NVLink recovery errors.", _nvlink("recovery")),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "Total number of NVLink bandwidth counters for all lanes (NVML data TX+RX, KiB).",
     lambda g: g.nvlink_bandwidth_kib),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors", _rows("uncorrectable")),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors", _rows("correctable")),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
     _rows("failure")),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending",
     _rows("pending")),
]  # fmt: skip
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"


@dataclass(frozen=True)
class XidState:
    """What the exporter remembers of Xids: the last per GPU, and counts in the window."""

    last: dict[int, int]  # GPU index -> last Xid
    counts: dict[tuple[int, int], int]  # (GPU index, Xid) -> how many in the window
    window_ms: int


def gpu_labels(node: str, g: GpuReading) -> dict[str, str]:
    return {
        "gpu": str(g.index), "UUID": g.uuid, "pci_bus_id": g.pci_bus_id,
        "device": f"nvidia{g.index}", "modelName": g.name, "Hostname": node,
    }  # fmt: skip


def gpu_series(node: str, readings: GpuReadings | None, xids: XidState) -> Iterator[Metric]:
    gpus = [g for g in readings.gpus if not g.lost] if readings is not None else []
    for name, kind, help_, value in FIELDS:
        family = Metric(name, help_, "gauge" if kind == "gauge" else "unknown")
        for g in gpus:
            v = value(g)
            if v is not None:
                family.add_sample(name, gpu_labels(node, g), float(v))
        yield family
    last = Metric(XID_ERRORS, "Value of the last XID error encountered.", "gauge")
    count = Metric(
        XID_COUNT, "Count of XID Errors within user-specified time window "
        "(see xid-count-window-size param).", "gauge",
    )  # fmt: skip
    for g in gpus:
        labels = gpu_labels(node, g)
        code = xids.last.get(g.index, 0)
        last.add_sample(XID_ERRORS, labels | {"err_code": str(code)}, float(code))
        for (gpu, xid), n in sorted(xids.counts.items()):
            if gpu == g.index:
                extra = {"window_size_in_ms": str(xids.window_ms), "xid": str(xid)}
                count.add_sample(XID_COUNT, labels | extra, float(n))
    yield last
    yield count
