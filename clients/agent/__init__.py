"""The per-node health agent: reads GPU (NVML) and InfiniBand (sysfs) health, reports faults.

One agent runs on each GPU node (a DaemonSet in production; one process per sandbox node
with the fake backend). Each check reads the node, classifies what it sees into the
policy's fault kinds, debounces, and sends a `report.NodeReport` per change (firing or
resolved) to the API, spooling to disk while the API cannot be reached.

Modules, one concern each: `report` (the wire model, shared with the API), `readings`
(what a backend reads), `backend` (the interface), `nvml_backend` / `fake_backend`,
`watchdog` (NVML calls that hang), `infiniband`, `counters`, `classify`, `debounce`,
`reporter` (sending and the spool), `node_condition` (optional GpuUnhealthy), `settings`,
and `agent` (the loop). `/metrics` (when `metrics_port` is set): `metrics` (the exporter and
its HTTP server), `dcgm_series` (dcgm-exporter's names and labels), `ib_series`
(node-exporter's), and `fake_live` (the fake node's moving load and growing counters).

This package imports nothing on import, so `autoclusters.clients.agent.report` stays light.
"""
