"""Pictures of a report (matplotlib, headless): outstanding bytes over time by stack with the
process's memory, size and lifetime histograms, and the growth of each leak suspect."""
from __future__ import annotations

import io
import os

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in the HTML page: findable
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402  (not pyplot: 0.1 s to import, no use here)
from matplotlib.ticker import FuncFormatter, MultipleLocator, NullLocator  # noqa: E402

from ..capture import Capture, private_file  # noqa: E402
from ..common.format import count_text, distinct_labels, frame_name, human_bytes  # noqa: E402
from ..symbolize import stack_frames  # noqa: E402
from . import analysis  # noqa: E402
from .plot_style import KIND_COLOURS, STACKS_SHOWN  # noqa: E402



def _binary_ticks(axis, top: float) -> None:
    """Byte ticks at round binary values (powers of two of a unit), about five of them."""
    step = 2 ** max(0, int(np.ceil(np.log2(max(top, 1) / 5))))
    axis.set_major_locator(MultipleLocator(step))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v)))


# Their groups as the time series holds them (capture PART_COLUMNS), with labels and colours.
PART_LAYERS = (("rss_heap_bytes", "malloc heaps", KIND_COLOURS["heap"]),
               ("rss_anonymous_bytes", "anonymous mmap", KIND_COLOURS["anonymous"]),
               ("rss_stack_bytes", "thread stacks", KIND_COLOURS["stack"]),
               ("rss_file_bytes", "files (code, data)", KIND_COLOURS["file"]),
               ("rss_shared_bytes", "shared memory", KIND_COLOURS["shared"]),
               ("rss_memhook_bytes", "memhook", KIND_COLOURS["memhook"]),
               ("rss_other_bytes", "kernel", KIND_COLOURS["kernel"]))


def _resident_parts(mem, times, series: dict) -> None:
    """The resident memory's parts, stacked under the RSS line (captures from before the parts
    have none)."""
    layers = [(np.asarray(series[k], np.float64), label, colour)
              for k, label, colour in PART_LAYERS if len(series.get(k, [])) == len(times)]
    layers = [x for x in layers if x[0].any()]
    if layers:
        mem.stackplot(times, *[v for v, _, _ in layers], labels=[l for _, l, _ in layers],
                      colors=[c for _, _, c in layers], alpha=0.8)


def over_time(cap: Capture, report: dict, symbolizer):
    """Top: outstanding bytes of the largest stacks, stacked, and the anonymous resident memory
    they live in. Bottom, same time axis: resident memory (RSS; it includes memhook's rings),
    its parts stacked under it."""
    times, series = analysis.stack_series(cap)
    fig = Figure(figsize=(10, 6.5))
    ax, mem = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.2]})
    top_value = 1.0
    if cap.processes:
        return _processes_over_time(cap, fig, ax, mem)
    if len(times):
        final = {s: v[-1] for s, v in series.items()}
        top = sorted(final, key=lambda s: -final[s])[:STACKS_SHOWN]
        total = np.asarray(cap.series["outstanding_bytes"], np.float64)
        layers = [series[s] for s in top]
        labels = distinct_labels([stack_frames(symbolizer.use(cap), cap.frames(s)) for s in top])
        rest = np.maximum(total - np.sum(layers, axis=0), 0) if layers else total
        # From attach, when nothing of the session was outstanding yet: a capture shorter than
        # one interval (memhook run of a short program) has a single point, and an area needs two.
        at = np.concatenate(([0.0], times)) if times[0] > 0 else times
        ax.stackplot(at, *[_from_attach(v, at) for v in [*layers, rest]],
                     labels=labels + ["other stacks"], alpha=0.85)
        top_value = float(max(total.max(initial=1), 1))
        # The process's memory where it was read (0: the process had exited by that tick).
        rss = np.asarray(cap.series.get("rss_bytes", []), np.float64)
        read = rss > 0 if len(rss) == len(times) else np.zeros(len(times), bool)
        dots = "." if read.sum() < 3 else None
        if read.any() and len(cap.series.get("anon_bytes", [])):
            anon = np.asarray(cap.series["anon_bytes"], np.float64)[read]
            ax.plot(times[read], anon, "k--", linewidth=1.2, marker=dots,
                    label="anonymous resident memory")
            top_value = max(top_value, float(anon.max()))
            mem.plot(times[read], anon, "k--", linewidth=1.2, marker=dots,
                     label="anonymous resident")
        if read.any():
            _resident_parts(mem, times[read], {k: np.asarray(v)[read] for k, v in
                                               cap.series.items() if len(v) == len(times)})
            mem.plot(times[read], rss[read], "k-", linewidth=1.2, marker=dots,
                     label="resident (RSS)")
            _binary_ticks(mem.yaxis, float(rss.max()))
        if not read.any():
            mem.text(0.5, 0.5, "not read: the process ended before the first interval",
                     transform=mem.transAxes, ha="center", va="center", fontsize=9)
            mem.set_yticks([])
    _legend(mem, "lower right")
    return _axes(fig, ax, mem, top_value, "Outstanding bytes by call stack", "process",
                 "time since attach (s)")


def _from_attach(values, at) -> np.ndarray:
    """A series preceded by its value at attach (0) where `at` starts there and it does not."""
    values = np.asarray(values, np.float64)
    return np.concatenate(([0.0], values)) if len(at) > len(values) else values


def _legend(axes, where: str) -> None:
    """The axes' legend, where something on them has a label (else matplotlib warns)."""
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc=where, fontsize=8, framealpha=0.9)


def _axes(fig, ax, mem, top_value: float, title: str, mem_label: str, xlabel: str):
    """What both over-time figures label the same way."""
    _binary_ticks(ax.yaxis, top_value)
    ax.set_ylabel("outstanding bytes")
    ax.set_title(title)
    _legend(ax, "upper left")
    ax.grid(alpha=0.3)
    mem.set_ylabel(mem_label)
    mem.set_xlabel(xlabel)
    mem.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _processes_over_time(cap: Capture, fig, ax, mem):
    """A capture of several processes: each one's outstanding bytes, and below its resident
    memory, on one clock (seconds since the first attach)."""
    t0 = min((p.meta.get("started_at") or 0 for p in cap.processes), default=0)
    top_value, top_rss = 1.0, 1.0
    for proc in cap.processes:
        s = proc.series
        if not len(s.get("time_s", [])):
            continue
        t = np.asarray(s["time_s"], np.float64) + (proc.meta.get("started_at") or t0) - t0
        out = np.asarray(s["outstanding_bytes"], np.float64)
        label = f"PID {proc.meta.get('pid')}"
        line, = ax.plot(t, out, linewidth=1.5, label=label)
        top_value = max(top_value, float(out.max(initial=1)))
        if len(s.get("rss_bytes", [])):
            rss = np.asarray(s["rss_bytes"], np.float64)
            mem.plot(t, rss, linewidth=1.2, color=line.get_color(), label=label)
            top_rss = max(top_rss, float(rss.max(initial=1)))
    _binary_ticks(mem.yaxis, top_rss)
    return _axes(fig, ax, mem, top_value, "Outstanding bytes by process", "resident (RSS)",
                 "time since the first attach (s)")


def _log2_labels(n: int, unit: str) -> list:
    if unit == "B":
        return [human_bytes(2 ** b) for b in range(n)]
    out = []
    for b in range(n):
        ns = 2 ** b
        out.append(f"{ns:.0f} ns" if ns < 1e3 else f"{ns / 1e3:.0f} µs" if ns < 1e6
                   else f"{ns / 1e6:.0f} ms" if ns < 1e9 else f"{ns / 1e9:.0f} s")
    return out


def histograms(cap: Capture, report: dict, symbolizer):
    """Allocation sizes and lifetimes, log2 buckets."""
    h = report.get("histograms", {})
    fig = Figure(figsize=(12, 4.5))
    axes = fig.subplots(1, 2)
    for ax, key, unit, title, xlabel in (
            (axes[0], "size_log2", "B", "Allocation sizes", "size (from)"),
            (axes[1], "lifetime_ns_log2", "ns", "Lifetimes of freed blocks", "lifetime (from)")):
        counts = np.asarray(h.get(key, []), np.float64)
        # Lifetimes known only to lie under a bound (their events' timing, or 1 µs, could not
        # tell them better): hatched, in the bucket the bound ends.
        under = np.asarray(h.get("lifetime_under_ns_log2", []) if unit == "ns" else [],
                           np.float64)
        nz = np.nonzero(np.concatenate([counts, under]) if len(under) else counts)[0] % max(
            len(counts), 1)
        ax.set_title(title)
        if not len(nz):  # (a capture without the per-stack behaviour blocks)
            ax.text(0.5, 0.5, "not in this capture", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        lo, hi = (int(nz.min()), int(nz.max()) + 1) if len(nz) else (0, 1)
        x = np.arange(lo, hi)
        if len(under) and under[lo:hi].any():
            ax.bar(x - 0.2, counts[lo:hi], width=0.4, color="tab:blue", label="lifetime in bucket")
            ax.bar(x + 0.2, under[lo:hi], width=0.4, color="white", edgecolor="tab:blue",
                   hatch="//", label="known only to be under the bucket's end")
            ax.legend(fontsize=8)
        else:
            ax.bar(x, counts[lo:hi] if len(counts) else [0], color="tab:blue")
        labels = _log2_labels(hi, unit)[lo:hi]
        step = max(1, len(x) // 10)
        ax.set_xticks(x[::step], labels[::step], rotation=45, ha="right", fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(("allocations" if unit == "B" else "frees") + " (log scale)")
        ax.set_yscale("log")
        # Decades named as counts (1k, not matplotlib's 10^3: mathtext, parsed per label) and
        # no minor ticks: together half of the HTML report's drawing time.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: count_text(v)))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def growth(cap: Capture, report: dict, symbolizer):
    """Late growth rate of each leak suspect; of a capture of several processes, each process's
    (its suspects' together), labelled with its first suspect."""
    procs = report.get("processes")
    rows = (procs or report.get("leak_suspects", []))[:STACKS_SHOWN]
    fig = Figure(figsize=(10, 0.5 * max(len(rows), 2) + 1.5))
    ax = fig.subplots()
    if procs:
        names = [f"PID {r['pid']}" + (": " + frame_name(r["top_suspect"]["frames"][0])
                                      if r.get("growing") and r["top_suspect"]["frames"] else "")
                 for r in rows][::-1]
        values = [r["growth_bytes_per_min"] for r in rows][::-1]
    else:
        names = distinct_labels([r["frames"] for r in rows])[::-1]
        values = [r["late_growth_bytes_per_min"] for r in rows][::-1]
    ax.barh(range(len(rows)), values, color=["tab:red" if v > 0 else "tab:gray" for v in values])
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    top_value = max(values, default=1) or 1
    _binary_ticks(ax.xaxis, top_value * 1.15)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, p: human_bytes(v) + "/min"))
    ax.set_xlim(0, top_value * 1.25)
    for y, v in enumerate(values):
        ax.text(v + top_value * 0.01, y, human_bytes(v) + "/min", va="center", fontsize=8)
    if not any(v > 0 for v in values):
        ax.text(0.5, 0.5, "no " + ("process" if procs else "suspect") + "'s live blocks grow "
                "at the end of the capture", transform=ax.transAxes, ha="center", va="center",
                fontsize=10, color="0.35")
    ax.set_xlabel("growth in the last third of the capture")
    ax.set_title("Processes: growth of their leak suspects at the end of the capture" if procs
                 else "Leak suspects: growth at the end of the capture")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


FIGURES = {"outstanding_over_time": over_time, "histograms": histograms, "growth": growth}


def render(cap: Capture, report: dict, symbolizer, fmt: str = "png") -> dict:
    """{figure name: image bytes}."""
    out = {}
    for name, make in FIGURES.items():
        fig = make(cap, report, symbolizer)
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=110)
        out[name] = buf.getvalue()
    return out


def write(cap: Capture, report: dict, symbolizer, directory: str, fmt: str = "png") -> list:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    paths = []
    for name, data in render(cap, report, symbolizer, fmt).items():
        path = os.path.join(directory, f"{name}.{fmt}")
        with private_file.create(path) as f:
            f.write(data)
        paths.append(path)
    return paths
