"""The per-node health agent: reads GPU (NVML) and InfiniBand (sysfs) health, reports faults.

One agent runs on each GPU node (a DaemonSet in production; one process per sandbox node
with the fake backend). Each check reads the node, classifies what it sees into the
policy's fault kinds, debounces, and sends a `NodeReport` per change (firing or resolved)
to the API, spooling to disk while the API cannot be reached. The report's model is
`core/node_report.py`: the wire model the API accepts, below both, so that neither imports
the other.

Modules, one concern each: `readings` (what a backend reads), `backend` (the interface),
`nvml_backend` / `fake_backend`, `watchdog` (NVML calls that hang), `infiniband`,
`counters`, `classify`, `debounce`, `reporter` (sending and the spool), `node_condition`
(optional GpuUnhealthy), `settings`, and `agent` (the loop). `/metrics` (when
`metrics_port` is set): `metrics` (the exporter and its HTTP server), `dcgm_series`
(dcgm-exporter's names and labels), `ib_series` (node-exporter's), and `fake_live` (the
fake node's moving load and growing counters). Jobs' progress (`progress_dir`, the
jobs' files of core/job_progress.py): `progress_rules` (JOB_HANG, SLOW_NODE: pure) and
`progress_series` (their /metrics).

This package imports nothing on import, so each module loads only what it needs (the agent's
command stays light: no Temporal, no API).
"""
