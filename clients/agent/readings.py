"""What one check reads from a node: GPU readings (NVML or fake), GPU events, InfiniBand.

The fake backend's JSON file is exactly these models (`fake_backend.FakeNode`), so a fault
written into it looks to the classifier the way the same fault read through NVML does.
A value of None means "not read" (unsupported on this GPU, or the call failed); it never
means zero.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, Field


class NvLinkReading(BaseModel):
    active: bool
    # NVML_NVLINK_ERROR_DL_*: replay, recovery, crc_flit, crc_data (cumulative counters).
    errors: dict[str, int] = Field(default_factory=dict)


class RemappedRows(BaseModel):
    """nvmlDeviceGetRemappedRows: (corrRows, uncRows, isPending, failureOccurred)."""

    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failure: bool = False


class FabricReading(BaseModel):
    """nvmlDeviceGetGpuFabricInfo(V): NVSwitch fabric registration of one GPU."""

    state: int  # NVML_GPU_FABRIC_STATE_*: 0 not supported, 1 not started, 2 in progress, 3 done
    status: int = 0  # an nvmlReturn_t; meaningful only when state is COMPLETED
    health_summary: int | None = None  # NVML_GPU_FABRIC_HEALTH_SUMMARY_*; None before v3


class GpuReading(BaseModel):
    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    lost: bool = False  # NVML answered NVML_ERROR_GPU_IS_LOST for this GPU
    reset_required: bool = False  # NVML answered NVML_ERROR_RESET_REQUIRED
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    remapped_rows: RemappedRows | None = None
    nvlinks: dict[int, NvLinkReading] = Field(default_factory=dict)
    recovery_action: int | None = None  # NVML_GPU_RECOVERY_ACTION_*: 0 none
    fabric: FabricReading | None = None
    clock_event_reasons: int | None = None  # nvmlClocksEventReason* bit mask
    temperature_c: int | None = None
    slowdown_temp_c: int | None = None
    pcie_replay_counter: int | None = None
    # What a dashboard shows (dcgm-exporter's default series); no fault is read from these.
    name: str = ""  # nvmlDeviceGetName: "NVIDIA H200" (dcgm-exporter's modelName)
    utilization_gpu: int | None = None  # percent, over NVML's sample period
    power_w: float | None = None  # nvmlDeviceGetPowerUsage is mW
    energy_mj: int | None = None  # since the driver loaded (nvmlDeviceGetTotalEnergyConsumption)
    fb_used_mib: int | None = None
    fb_free_mib: int | None = None
    nvlink_bandwidth_kib: int | None = None  # cumulative NVLink data TX+RX over all links
    errors: dict[str, str] = Field(default_factory=dict)  # NVML call -> error, for what failed


class GpuReadings(BaseModel):
    backend: str = "fake"
    driver_version: str = ""
    device_count: int | None = None
    lost: bool = False  # a node-level call (the device count) answered GPU_IS_LOST
    hung_calls: list[str] = Field(default_factory=list)  # NVML calls past the watchdog timeout
    gpus: list[GpuReading] = Field(default_factory=list)


class GpuEvent(BaseModel):
    """One event from the NVML event set (or injected into the fake file).

    kind: xid (code = the Xid), recovery_action (code = NVML_GPU_RECOVERY_ACTION_*), or
    gpu_lost (the event wait answered NVML_ERROR_GPU_IS_LOST).
    """

    kind: Literal["xid", "recovery_action", "gpu_lost"] = "xid"
    code: int = 0
    gpu: int | None = None
    uuid: str = ""
    at: AwareDatetime
    seq: int = 0  # the fake file numbers its events, so each is delivered once


class IbPortReading(BaseModel):
    hca: str
    port: int
    state: str = ""  # e.g. "4: ACTIVE"
    phys_state: str = ""  # e.g. "5: LinkUp"
    rate: str = ""  # e.g. "400 Gb/sec (4X NDR)"
    link_layer: str = ""  # InfiniBand or Ethernet
    counters: dict[str, int] = Field(default_factory=dict)


class IbReadings(BaseModel):
    hcas: list[str] = Field(default_factory=list)  # adapters present now
    ports: list[IbPortReading] = Field(default_factory=list)
    errors: dict[str, str] = Field(default_factory=dict)  # path -> what went wrong reading it


def state_number(text: str) -> int | None:
    """The number in a sysfs "4: ACTIVE" / "5: LinkUp" value."""
    head = text.split(":", 1)[0].strip()
    return int(head) if head.isdigit() else None


def rate_gbps(text: str) -> float | None:
    """The Gb/s in a sysfs rate such as "400 Gb/sec (4X NDR)"."""
    head = text.strip().split(" ", 1)[0]
    try:
        return float(head)
    except ValueError:
        return None
