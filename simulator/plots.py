"""PNG plots of a comparison, written with matplotlib (imported only here, on demand)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.config import HOUR
from simulator.report import Comparison

if TYPE_CHECKING:
    from matplotlib.figure import Figure

OCCUPANCY_PNG = "occupancy.png"
DRAIN_WASTE_PNG = "drain-waste.png"


#: The moving average of the occupancy plot, in hours (the samples come every
#: ``Scenario.sample_seconds``, half an hour by default): an hour's noise hides the trend.
SMOOTHING_HOURS = 6.0


def moving_average(series: Sequence[tuple[float, float]], hours: float
                   ) -> list[tuple[float, float]]:
    """Each sample replaced by the mean of those within ``hours`` / 2 on either side."""
    out = []
    lo = hi = 0
    total = 0.0
    for t, _ in series:
        while hi < len(series) and series[hi][0] <= t + hours / 2:
            total += series[hi][1]
            hi += 1
        while series[lo][0] < t - hours / 2:
            total -= series[lo][1]
            lo += 1
        out.append((t, total / (hi - lo)))
    return out


def occupancy_figure(c: Comparison) -> Figure:
    """Occupancy over time per policy (the first seed), as a moving average; the reference
    policy (the first) drawn last, thick and black, so that no other hides it; each policy's
    mean occupancy over all seeds in the legend, which sits beside the data, not on it."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 5))
    reference = c.policies[0].name
    for p in [*c.policies[1:], c.policies[0]]:
        smooth = moving_average(c.runs[p.name][0].occupancy_series, SMOOTHING_HOURS)
        mean = c.estimate(p.name, "occupancy").mean  # in %, as the table gives it
        is_reference = p.name == reference
        ax.plot([h for h, _ in smooth], [100 * f for _, f in smooth],
                label=f"{p.name}{' (reference)' if is_reference else ''}: mean {mean:.1f}%",
                linewidth=2.5 if is_reference else 1.2, color="black" if is_reference else None,
                alpha=1.0 if is_reference else 0.8, zorder=3 if is_reference else 2)
        if is_reference:  # its mean as a dotted line across, read against the y axis
            ax.axhline(mean, color="black", linestyle=":", linewidth=1, zorder=1)
            ax.annotate(f"{mean:.1f}%", (1.0, mean), xycoords=("axes fraction", "data"),
                        xytext=(-4, 3), textcoords="offset points", ha="right",
                        fontsize="small")
    handles, labels = ax.get_legend_handles_labels()
    order = [len(labels) - 1, *range(len(labels) - 1)]  # the reference first in the legend
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize="small",
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              title=f"mean occupancy over {len(c.seeds)} seed(s)", title_fontsize="small")
    ax.set_xlabel("hours since the end of the warm-up")
    ax.set_ylabel("cores used / cores in service (%)")
    ax.set_title(f"Core occupancy over time, {SMOOTHING_HOURS:g} h moving average "
                 f"(seed {c.seeds[0]})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_plots(c: Comparison, out: Path) -> list[Path]:
    """Occupancy over time per policy, and the waste of each 'free nodes' event per policy
    (both for the first seed); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig = occupancy_figure(c)
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
