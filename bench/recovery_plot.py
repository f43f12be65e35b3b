"""The recovery paths side by side, from bench/mttr.py's `--record` files: a PNG of each
fault's seconds from the fault to the job training again at full width, per path (each
fault a dot, the median a bar, the issue's target a dashed line), and the markdown table
docs/recovery.md shows.

    .venv/bin/python bench/recovery_plot.py requeue.json in-job.json borrowed.json \\
        --out docs/recovery/paths.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BACK = "job running again"
# Issue 22's targets for the job training again (medians unless said), seconds.
TARGETS: dict[str, str] = {
    "requeue": "median ≤ 11 s (no slower than before)",
    "in-job": "median ≤ 5 s, p95 ≤ 7 s",
    "borrowed": "full width for the repair, 0 requests failed",
}
TARGET_MEDIAN_S = {"requeue": 11.0, "in-job": 5.0}
ROWS = [
    ("detection (fault → incident open)", "detection"),
    ("quarantine (node drained)", "quarantine"),
    ("job requeued", "job requeued"),
    ("old run ended (Slurm requeues it)", "old run ended"),
    ("job allocated again", "job allocated again"),
    ("job relaunched (batch script again)", "job relaunched"),
    ("checkpoint loaded", "checkpoint loaded"),
    ("borrowed node lent", "borrowed node lent"),
    (f"**{BACK}** (first step at full width)", BACK),
    ("steps done again", "steps done again"),
    ("work lost per fault (s)", "work lost (s)"),
    ("back in service (capacity back)", "back in service"),
    ("borrowed node given back (serving inference again)", "borrowed node given back"),
    ("job back on the repaired node (first step)", "job off the borrowed node"),
    ("steps done again at the give-back", "steps done again at give-back"),
    ("requests failed (inference)", "requests failed"),
]


def load(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in paths]


def markdown(records: list[dict[str, Any]]) -> str:
    """Median / p95 (n) per phase and path; a phase a path does not have is blank."""
    head = "| seconds from the fault | " + " | ".join(r["path"] for r in records) + " |"
    lines = [head, "|---" * (len(records) + 1) + "|"]
    for label, key in ROWS:
        cells = []
        for r in records:
            s = r["summary"].get(key)
            cells.append("" if s is None else f"{_num(s['median'])} / {_num(s['p95'])} ({s['n']})")
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(
        "| target (issue 22) | " + " | ".join(TARGETS.get(r["path"], "") for r in records) + " |"
    )
    return "\n".join(lines)


def _num(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"


def plot(records: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for i, r in enumerate(records):
        vals = [v for row in r["rows"] if (v := row.get(BACK)) is not None]
        xs = [i + 0.08 * (j - (len(vals) - 1) / 2) for j in range(len(vals))]
        ax.scatter(xs, vals, color="#1f77b4", zorder=3, s=22)
        s = r["summary"].get(BACK)
        if s:
            ax.hlines(s["median"], i - 0.3, i + 0.3, color="black", linewidth=2)
            ax.annotate(
                f"median {s['median']:.2f} s\np95 {s['p95']:.2f} s, n={s['n']}",
                (i + 0.32, s["median"]),
                fontsize=7,
                va="center",
            )
        if (t := TARGET_MEDIAN_S.get(r["path"])) is not None:
            ax.hlines(t, i - 0.3, i + 0.3, color="#d62728", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(records)), [r["path"] for r in records])
    ax.set_xlim(-0.5, len(records) - 0.1)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("seconds, fault → job training again")
    ax.set_title("Recovery paths (bench/mttr.py; dashed: issue 22's median target)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("records", nargs="+", type=Path, help="bench/mttr.py --record files")
    p.add_argument("--out", type=Path, default=None, help="the PNG to write")
    args = p.parse_args()
    records = load(args.records)
    print(markdown(records))
    for r in records:
        m = r["machine"]
        print(
            f"\n{r['path']}: {r['command']} ({r['date']}; {m['cpus']} CPUs, load average "
            f"{m['load_before']} before, {m['load_after']} after; job {r['job']})"
        )
    if args.out:
        print(f"\nplot: {plot(records, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
