"""The shared settings' flat names before they were grouped, and a clear error for each.

A file or an environment that still says `temporal_address` (AUTOCLUSTERS_TEMPORAL_ADDRESS)
would otherwise be ignored without a word and the default used: a worker pointed at the
wrong Temporal. Instead it is refused, naming the setting's new place.
"""

from __future__ import annotations

from collections.abc import Mapping

ENV_PREFIX = "AUTOCLUSTERS_"

# old flat name -> (group, name in it)
RENAMED: dict[str, tuple[str, str]] = {
    **{
        f"temporal_{k}": ("temporal", k)
        for k in (
            "address",
            "namespace",
            "ui_url",
            "tls",
            "tls_cert",
            "tls_key",
            "tls_ca",
            "tls_server_name",
            "api_key",
        )
    },  # fmt: skip
    "task_queue": ("temporal", "task_queue"),
    "slurm_conf": ("slurm", "conf"),
    "slurm_bin_dir": ("slurm", "bin_dir"),
    "kubeconfig": ("kubernetes", "kubeconfig"),
    **{
        f"crusoe_{k}": ("crusoe", k)
        for k in (
            "profile",
            "config_file",
            "project_id",
            "cluster_id",
            "node_pool_ids",
            "poll_s",
            "replace_timeout_s",
        )
    },  # fmt: skip
    "sandbox_state_dir": ("sandbox", "state_dir"),
    "boot_delay_s": ("sandbox", "boot_delay_s"),
    "expected_gpus": ("health", "expected_gpus"),
    "screen_dir": ("health", "screen_dir"),
    "screen_python": ("health", "screen_python"),
    "repair_timeout_s": ("remediation", "repair_timeout_s"),
    "admission_poll_s": ("remediation", "admission_poll_s"),
    "worker_metrics_port": ("worker", "metrics_port"),
    "worker_metrics_host": ("worker", "metrics_host"),
    "worker_metrics_token": ("worker", "metrics_token"),
    "stuck_run_check_s": ("worker", "stuck_run_check_s"),
    "console_loopback_open": ("console", "loopback_open"),
    "console_session_s": ("console", "session_s"),
    "console_secret": ("console", "secret"),
    "prometheus_url": ("monitoring", "prometheus_url"),
    "alertmanager_url": ("monitoring", "alertmanager_url"),
    "alert_node_label": ("monitoring", "alert_node_label"),
    "silence_max_s": ("monitoring", "silence_max_s"),
    "approval_keys": ("approval", "keys"),
    "handoff_secret": ("handoff", "secret"),
}


def renamed_in(values: Mapping[str, object], environ: Mapping[str, str]) -> list[str]:
    """One line per old name in a file's (or caller's) values or in the environment."""
    out = []
    for old, (group, name) in RENAMED.items():
        env = f"{ENV_PREFIX}{old.upper()}"
        if old in values:
            out.append(f"{old} is now [{group}] {name}")
        if env in environ:
            out.append(f"{env} is now {ENV_PREFIX}{group.upper()}__{name.upper()}")
    return out
