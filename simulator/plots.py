"""PNG plots of a comparison, written with matplotlib (imported only here, on demand)."""

from __future__ import annotations

from pathlib import Path

from simulator.config import HOUR
from simulator.report import Comparison

OCCUPANCY_PNG = "occupancy.png"
DRAIN_WASTE_PNG = "drain-waste.png"


def write_plots(c: Comparison, out: Path) -> list[Path]:
    """Occupancy over time per policy, and the waste of each 'free nodes' event per policy
    (both for the first seed); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(10, 5))
    for p in c.policies:
        series = c.runs[p.name][0].occupancy_series
        ax.plot([h for h, _ in series], [100 * f for _, f in series], label=p.name,
                linewidth=1)
    ax.set_xlabel("hours since the end of the warm-up")
    ax.set_ylabel("cores used / cores in service (%)")
    ax.set_title(f"Core occupancy over time (seed {c.seeds[0]})")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / OCCUPANCY_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(10, 5))
    policies = [p for p in c.policies if p.multi_payload and p.time_aware] or list(c.policies)
    width = 0.8 / max(1, len(policies))
    count = 0
    for i, p in enumerate(policies):
        events = [d for d in c.runs[p.name][0].drains if d.kind == "free"]
        count = max(count, len(events))
        xs = [j + 1 + (i - (len(policies) - 1) / 2) * width for j in range(len(events))]
        # An edge in the bar's own colour: a policy that wasted nothing shows a line at 0,
        # not a gap that reads as missing data.
        bars = ax.bar(xs, [d.draining_waste / HOUR for d in events], width,
                      label=f"{p.name} draining", linewidth=1.5)
        for bar in bars:
            bar.set_edgecolor(bar.get_facecolor())
        ax.bar(xs, [d.kill_waste / HOUR for d in events], width,
               bottom=[d.draining_waste / HOUR for d in events], color="black", alpha=0.5,
               label="killed work" if i == 0 else None)
    ax.set_xticks(range(1, count + 1))  # events are counted: 1, 2, 3 ...
    ax.set_xlabel("'free nodes' event")
    ax.set_ylabel("core-hours")
    ax.set_title(f"Waste of each 'free nodes' event by victim choice (seed {c.seeds[0]})")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path = out / DRAIN_WASTE_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written
