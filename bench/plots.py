#!/usr/bin/python3
"""bench/plots.py: draws the PNGs of bench/results/ from what `make bench`
wrote there.

- <stem>-<shape>.png, one per load shape of bench/fleet.py (stem `fleet`, or
  `fleet-quick` for BENCH_MODE=quick), one panel per fleet size: the fleet's
  admissions per second over time (100 ms bins, by mode) and per window of
  one period, against the limit; the fault window shaded, events marked, and
  the live node count that the daemons reported, when it changed.
- throughput.png: decisions/s and sync p99 of sluiced next to its baselines
  (the echo references of latest.md, the per-decision EVALSHA of global.md),
  read from the tables of those two files.

Run with /usr/bin/python3 (python3-matplotlib, python3-msgpack not needed).
"""

import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DPI = 90
PANEL_SIZE_IN = (10, 3.2)   # width, height of one fleet panel
LEGEND_HEIGHT_IN = 0.6      # below the panels
Y_HEADROOM = 2.0            # the y axis reaches this many times the limit
SLUICED_COLOR, BASELINE_COLOR = "#1f77b4", "#9e9e9e"
MODE_COLORS = {"normal": "#1f77b4", "fallback": "#ff7f0e", "other": "#d62728"}


# --- fleet ---------------------------------------------------------------------------

def plot_shape(runs, limit, burst, period_s, path):
    """One PNG: a panel per fleet size of one shape."""
    fig, axes = plt.subplots(len(runs), 1, squeeze=False,
                             figsize=(PANEL_SIZE_IN[0],
                                      PANEL_SIZE_IN[1] * len(runs) + LEGEND_HEIGHT_IN))
    legend = {}  # label -> handle, over every panel
    for ax, run in zip(axes[:, 0], runs):
        bin_s = run["bin_s"]
        series = run["series"]
        times = [i * bin_s for i in range(len(series["normal"]))]
        bottom = [0.0] * len(times)
        for mode, color in MODE_COLORS.items():
            rate = [n / bin_s for n in series[mode]]
            if any(rate):
                ax.bar(times, rate, width=bin_s, bottom=bottom, align="edge", color=color,
                       alpha=0.55,
                       label="admitted/s, mode %s (%.0f ms bins)" % (mode, bin_s * 1000))
                bottom = [b + r for b, r in zip(bottom, rate)]
        # A shape may have a burst and a period of its own (sliding-log,
        # contended); older files have only the file's.
        run_burst, run_period = run.get("burst", burst), run.get("period_s", period_s)
        windows = run["windows"]  # [start, admitted / (limit x W + burst), judged]
        ax.plot([w[0] + run_period / 2 for w in windows],
                [w[1] * (limit * run_period + run_burst) / run_period for w in windows],
                color="black", linewidth=1.2,
                label="admitted per %g s window (at its middle)" % run_period)
        ax.axhline(limit, color="red", linestyle="--", linewidth=1, label="limit %d/s" % limit)
        fault = run["fault"]
        if fault:
            ax.axvspan(fault["at_s"], fault["end_s"], color="red", alpha=0.12,
                       label="fault window (fault to every node normal): no accuracy windows")
        for p0, p1 in run["pauses"]:
            ax.axvspan(p0, p1, color="black", alpha=0.3,
                       label="generator paused (its windows left out)")
        for t, name in run["events"]:
            ax.axvline(t, color="black", linestyle=":", linewidth=1)
            ax.text(t, limit * Y_HEADROOM * 0.97, " " + name, fontsize=8, va="top")
        offered = sum(series["offered"]) / run["seconds"]
        ax.set_xlim(0, run["seconds"] + 0.5)
        ax.set_ylim(0, limit * Y_HEADROOM)
        ax.set_xlabel("seconds since the load started")
        ax.set_ylabel("admitted / s")
        ax.set_title("%s, N = %d: offered %.0f/s on average, limit %d/s, burst %d"
                     % (run["shape"], run["nodes"], offered, limit, run_burst),
                     fontsize=10)
        counts = [c for _, c in run["live_nodes"]]
        if min(counts) != max(counts):
            twin = ax.twinx()
            twin.step([t for t, _ in run["live_nodes"]], counts, where="post", color="green",
                      linewidth=1)
            twin.set_ylim(0, max(counts) + 1)
            twin.set_ylabel("live nodes", color="green")
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="lower center", fontsize=7, ncol=3)
    fig.tight_layout(rect=(0, LEGEND_HEIGHT_IN / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_fleet(stem):
    with open(os.path.join(RESULTS, stem + ".json")) as f:
        data = json.load(f)
    shapes = []
    for run in data["runs"]:
        if run["shape"] not in shapes:
            shapes.append(run["shape"])
    written = []
    for shape in shapes:
        path = os.path.join(RESULTS, "%s-%s.png" % (stem, shape))
        plot_shape([r for r in data["runs"] if r["shape"] == shape], data["limit_per_s"],
                   data["burst"], data["period_s"], path)
        written.append(path)
    return written


# --- throughput against the baselines ----------------------------------------------------

def table(name):
    """The first markdown table of results/NAME whose header starts with
    `| row |`, as a list of {column: cell}."""
    with open(os.path.join(RESULTS, name)) as f:
        lines = [line.strip() for line in f]
    start = next(i for i, line in enumerate(lines) if line.startswith("| row |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def is_baseline(row_name):
    return "echo" in row_name or "evalsha" in row_name


def bars(ax, names, values, title, unit, log=False):
    colors = [BASELINE_COLOR if is_baseline(n) else SLUICED_COLOR for n in names]
    ax.barh(range(len(names)), values, color=colors)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    if log:
        # From the power of ten below the smallest bar, so that lengths compare.
        ax.set_xscale("log")
        ax.set_xlim(left=10 ** math.floor(math.log10(min(values))), right=max(values) * 3)
    for i, v in enumerate(values):
        ax.text(v, i, " " + (("%.2fM" % (v / 1e6)) if v >= 1e6 else "%.0f" % v if v >= 100
                             else "%.1f" % v), va="center", fontsize=7)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(unit)


def plot_throughput(path, suffix):
    """suffix: "" for the full run's tables, "-quick" for the smoke run's."""
    local = table("latest%s.md" % suffix)
    glob = table("global%s.md" % suffix)
    pipelined = [r for r in local if r["placement"] == "unpinned"]
    sync = [r for r in local if r["placement"] != "unpinned" and r["p99 µs"]
            and "denied" not in r["row"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    bars(axes[0], [r["row"] for r in pipelined], [float(r["decisions/s"]) for r in pipelined],
         "local path, pipelined (latest.md)", "decisions/s")
    bars(axes[1], [r["row"] for r in glob], [float(r["decisions/s"]) for r in glob],
         "global path, pipelined (global.md)", "decisions/s (log)", log=True)
    bars(axes[2], ["%s @ %s" % (r["row"], r["placement"]) for r in sync],
         [float(r["p99 µs"]) for r in sync], "sync p99 (latest.md)", "µs (log)", log=True)
    fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=SLUICED_COLOR),
                        plt.Rectangle((0, 0), 1, 1, color=BASELINE_COLOR)],
               labels=["sluiced", "baseline (echo, rpc-echo, EVALSHA per decision)"],
               loc="lower center", ncol=2, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def main():
    mode = os.environ.get("BENCH_MODE", "full")
    if mode not in ("quick", "full") or len(sys.argv) != 1:
        sys.exit("usage: BENCH_MODE=quick|full bench/plots.py")
    suffix = "" if mode == "full" else "-quick"
    written = plot_fleet("fleet" + suffix)
    written.append(plot_throughput(os.path.join(RESULTS, "throughput%s.png" % suffix), suffix))
    for path in written:
        print("plots: wrote " + os.path.relpath(path))


if __name__ == "__main__":
    main()
