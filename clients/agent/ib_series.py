"""InfiniBand ports as node-exporter's infiniband collector exports them.

Names and labels (`device`, `port`) are node_exporter's (collector/infiniband_linux.go),
so its dashboards and the InfinibandLinkDown rule work unchanged: `state_id` (4 ACTIVE),
`physical_state_id` (5 LinkUp), `rate_bytes_per_second`, and the sysfs counters under
their node-exporter names with `_total`. Like node-exporter there is no host label: the
scrape configuration adds the node (the rules read it from `node`).

The data counters in sysfs count 4-octet words; node-exporter's bytes are four times that.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from autoclusters.clients.agent.readings import IbReadings, rate_gbps, state_number

LABELS = ["device", "port"]
PREFIX = "node_infiniband_"
# sysfs counter -> (node-exporter name, multiplier)
COUNTERS: dict[str, tuple[str, int]] = {
    "excessive_buffer_overrun_errors": ("excessive_buffer_overrun_errors_total", 1),
    "link_downed": ("link_downed_total", 1),
    "link_error_recovery": ("link_error_recovery_total", 1),
    "local_link_integrity_errors": ("local_link_integrity_errors_total", 1),
    "multicast_rcv_packets": ("multicast_packets_received_total", 1),
    "multicast_xmit_packets": ("multicast_packets_transmitted_total", 1),
    "port_rcv_constraint_errors": ("port_constraint_errors_received_total", 1),
    "port_xmit_constraint_errors": ("port_constraint_errors_transmitted_total", 1),
    "port_rcv_data": ("port_data_received_bytes_total", 4),
    "port_xmit_data": ("port_data_transmitted_bytes_total", 4),
    "port_rcv_discards": ("port_discards_received_total", 1),
    "port_xmit_discards": ("port_discards_transmitted_total", 1),
    "port_rcv_errors": ("port_errors_received_total", 1),
    "port_rcv_packets": ("port_packets_received_total", 1),
    "port_xmit_packets": ("port_packets_transmitted_total", 1),
    "port_xmit_wait": ("port_transmit_wait_total", 1),
    "unicast_rcv_packets": ("unicast_packets_received_total", 1),
    "unicast_xmit_packets": ("unicast_packets_transmitted_total", 1),
    "port_rcv_remote_physical_errors": ("port_receive_remote_physical_errors_total", 1),
    "port_rcv_switch_relay_errors": ("port_receive_switch_relay_errors_total", 1),
    "symbol_error": ("symbol_error_total", 1),
    "VL15_dropped": ("vl15_dropped_total", 1),
}
HELP = {
    "state_id": "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, "
    "4: active, 5: act defer)",
    "physical_state_id": "Physical state of the InfiniBand port (0: no change, 1: sleep, "
    "2: polling, 3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)",
    "rate_bytes_per_second": "Maximum signal transfer rate",
}


def ib_series(ib: IbReadings | None) -> Iterator[Metric]:
    ports = ib.ports if ib is not None else []
    gauges = {k: GaugeMetricFamily(PREFIX + k, h, labels=LABELS) for k, h in HELP.items()}
    counters = {
        name: CounterMetricFamily(PREFIX + name, f"sysfs counters/{sysfs}", labels=LABELS)
        for sysfs, (name, _) in COUNTERS.items()
    }
    for p in ports:
        where = [p.hca, str(p.port)]
        for key, text in (("state_id", p.state), ("physical_state_id", p.phys_state)):
            n = state_number(text)
            if n is not None:
                gauges[key].add_metric(where, n)
        gbps = rate_gbps(p.rate)
        if gbps is not None:
            gauges["rate_bytes_per_second"].add_metric(where, gbps * 1e9 / 8)
        for sysfs, value in sorted(p.counters.items()):
            if sysfs in COUNTERS:
                name, times = COUNTERS[sysfs]
                counters[name].add_metric(where, value * times)
    yield from gauges.values()
    yield from counters.values()
