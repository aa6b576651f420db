"""One self-contained HTML file: summary, ranked leak suspects with their stacks, the plots as
inline SVG, and an interactive flame graph of outstanding bytes. No network fetches."""
from __future__ import annotations

import html
import json
import os

from ..capture import Capture
from ..common import attribution
from ..common.format import duration_text, frame_name, frame_text, human_bytes, leak_site
from ..common.short_names import short
from .plot_style import KIND_COLOURS as RESIDENT_COLOURS
from .text import (abandoned_lines, census_lines, census_ok, dropped_frees_lines,
                   leak_check_lines, mapping_lines, process_memory_text)

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}.num{text-align:right}
pre{margin:2px 0;font-size:12px;white-space:pre-wrap}.why{color:#555;font-size:12px}
#flame,#peak-flame{position:relative;width:100%;font-size:11px}
#flame div,#peak-flame div{position:absolute;height:17px;overflow:hidden;white-space:nowrap;box-sizing:border-box;
border:1px solid #fff;background:#e8864a;cursor:pointer;padding:0 3px;color:#000}
#flame div:hover,#peak-flame div:hover{filter:brightness(1.1)}
#flame div.match{outline:2px solid #c0143c;outline-offset:-2px;font-weight:bold}
#flame-controls{margin:6px 0;font-size:13px}#flame-controls input[type=search]{width:260px}
#crumb,#peak-crumb{margin:6px 0;font-size:12px;color:#555}
svg{max-width:100%;height:auto}
#rss{display:flex;width:100%;height:28px;border:1px solid #999;margin:8px 0}
#rss div{height:100%;box-sizing:border-box;border-right:1px solid #fff}
.key{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:middle}
"""

# An icicle: the root on top, callees below; widths are the chosen weight (outstanding bytes,
# bytes allocated, blocks allocated). Each frame is coloured by its kind: the program's own code,
# other libraries, the runtime (attribution.py). Click to zoom into a frame, click the top bar
# to zoom out; the search box outlines the frames whose name holds its text and sums what they
# hold (each stack once). The address's #search=TEXT and #weight=NAME set both on load, so a
# link can carry them.
SCRIPT = """
function fmt(b) { const u = ['B','KiB','MiB','GiB']; let i = 0;
  while (b >= 1024 && i < 3) { b /= 1024; i++; } return (i ? b.toFixed(1) : b) + ' ' + u[i]; }
function hashParam(name) {
  const m = new RegExp('[#&]' + name + '=([^&]*)').exec(location.hash);
  return m ? decodeURIComponent(m[1]) : '';
}
function flame(dataId, boxId, crumbId, controls) {
  const data = JSON.parse(document.getElementById(dataId).textContent);
  const box = document.getElementById(boxId), crumb = document.getElementById(crumbId);
  let weight = 0, term = '', root = null, top = null, path = [];
  function build() {
    root = {name: 'all', kind: 2, value: 0, children: {}};
    for (const [ids, ...values] of data.stacks) {
      const value = values[weight] || 0; if (!value) continue;
      let node = root; root.value += value;
      for (const id of ids) {
        const [name, kind, label] = data.frames[id];
        const key = 'f' + id;  // (not the number: an object lists those in order, not as added)
        node = node.children[key] = node.children[key] ||
          {name, label, kind, value: 0, children: {}};
        node.value += value;
      }
    }
    top = root; path = [];
  }
  function matched(node) {
    return term && (node.name.toLowerCase().includes(term) ||
                    (node.label || '').toLowerCase().includes(term));
  }
  function sumMatched(node) {
    if (matched(node)) return node.value;
    let s = 0; for (const c of Object.values(node.children)) s += sumMatched(c); return s;
  }
  function draw() {
    box.innerHTML = ''; let depth = 0;
    const width = box.clientWidth;
    function place(node, x, w, d) {
      if (w < 2) return;
      const el = document.createElement('div');
      el.style.left = x + 'px'; el.style.width = w + 'px'; el.style.top = (d * 18) + 'px';
      el.style.background = KIND_COLOURS[node.kind];
      el.dataset.kind = node.kind;
      if (matched(node)) el.className = 'match';
      el.textContent = node.label || node.name;
      el.title = node.name + ' — ' + (weight === 2 ? node.value + ' blocks' : fmt(node.value))
        + ' (' + KIND_NAMES[node.kind] + ')';
      el.onclick = () => {
        if (node === top) { top = path.length ? path.pop() : root; }
        else { path.push(top); top = node; }
        draw();
      };
      box.appendChild(el); depth = Math.max(depth, d);
      let cx = x;
      for (const c of Object.values(node.children).sort((a, b) => b.value - a.value)) {
        const cw = w * c.value / node.value; place(c, cx, cw, d + 1); cx += cw;
      }
    }
    place(top, 0, width, 0);
    box.style.height = ((depth + 1) * 18) + 'px';
    const unit = v => weight === 2 ? v + ' blocks' : fmt(v);
    crumb.textContent = (top === root ? 'Click a frame to zoom in.' :
        'Zoomed into ' + top.name + ' (' + unit(top.value) + '); click the top bar to zoom out.')
      + (term ? ' Matching "' + term + '": ' + unit(sumMatched(root)) + ' of ' +
         unit(root.value) + '.' : '');
  }
  if (controls) {
    const search = document.getElementById('flame-search');
    const weights = document.getElementsByName('flame-weight');
    search.value = hashParam('search');
    for (const r of weights) r.checked = r.value === (hashParam('weight') || 'outstanding');
    const read = () => {
      term = search.value.trim().toLowerCase();
      const w = [...weights].find(r => r.checked);
      const next = ['outstanding', 'allocated', 'count'].indexOf(w ? w.value : 'outstanding');
      if (next !== weight || !root) { weight = next; build(); }
      draw();
    };
    search.oninput = read; for (const r of weights) r.onchange = read;
    read();
  } else { build(); draw(); }
}
// Tables: a click on a column's header sorts by it (largest first, again: smallest first);
// #sort=TABLE:COLUMN sorts one on load; #expand=TABLE:ROW opens a row's stack.
function sortTable(table, col, desc) {
  const rows = [...table.rows].slice(1);
  const key = r => { const c = r.cells[col];
    return c.dataset.v !== undefined ? parseFloat(c.dataset.v) : c.textContent; };
  rows.sort((a, b) => { const x = key(a), y = key(b);
    const c = typeof x === 'number' ? x - y : String(x).localeCompare(String(y));
    return desc ? -c : c; });
  for (const r of rows) r.parentNode.appendChild(r);
  table.dataset.sorted = col + (desc ? ' desc' : ' asc');
}
for (const table of document.querySelectorAll('table.sortable')) {
  [...table.rows[0].cells].forEach((th, col) => {
    th.style.cursor = 'pointer'; th.title = 'sort by this column';
    th.onclick = () => sortTable(table, col, table.dataset.sorted !== col + ' desc');
  });
}
const sortBy = hashParam('sort').split(':');
if (sortBy.length === 2 && document.getElementById(sortBy[0]))
  sortTable(document.getElementById(sortBy[0]), parseInt(sortBy[1]), true);
// #expand=TABLE:ROW opens that row's stack as a reader's click on it does.
const expand = hashParam('expand').split(':');
if (expand.length === 2 && document.getElementById(expand[0])) {
  const row = document.getElementById(expand[0]).rows[parseInt(expand[1])];
  const summary = row && row.querySelector('details.stack > summary');
  if (summary) summary.click();
}
flame('flame-data', 'flame', 'crumb', true);
if (document.getElementById('peak-data')) flame('peak-data', 'peak-flame', 'peak-crumb', false);
document.body.dataset.drawnMs = Math.round(performance.now());  // (benchmarks/html_load.py)
"""


# own, libraries, runtime, then Python's and JIT-compiled frames: the key and the script's
# (render) alike
KIND_COLOURS = ("#e8864a", "#6fa8dc", "#c2c2c2", "#9fd07a", "#c79be0")
KIND_NAMES = ("the program", "other libraries", "the runtime", "Python code",
              "JIT-compiled code")


def report_executable(cap: Capture) -> set:
    """The program's own files: the executable of each process the capture holds, by path and
    by file name (a capture read elsewhere names them as the target saw them)."""
    exes = {c.meta.get("exe") for c in (cap.processes or [cap]) if c.meta.get("exe")}
    return exes | {os.path.basename(e) for e in exes}


def frame_kind(f: dict, exes: set) -> int:
    """0: the program's own code (its executable, or a frame of no module: JIT code, or one
    whose module is unknown), 1: another library, 2: the runtime (attribution.py)."""
    if attribution.is_marker(f):
        return 2  # (a marker, "[no unwind info]", is not the program's code either)
    if f.get("kind") == "python":
        return 2 if attribution.is_python_library(f) else 3
    if f.get("kind") == "jit":
        return 2 if attribution.is_jit_runtime(f) else 4
    if attribution.DEFAULT.is_runtime(f):
        return 2
    module = f.get("module")
    return 0 if not module or module in exes or os.path.basename(module) in exes else 1


class FlameFrames:
    """The flame graph's frames, each once: [full name (the tooltips, the search), kind, short
    name (the bars' labels: short_names.py)] in `table`, and each stack as indices into it, root
    first. Stacks share the dicts of an address (symbolize.stack_frames) and an address's
    function its name: a 10,000-stack page held every frame's names in every stack, 5 MB."""

    def __init__(self, exes: set):
        self.exes, self.table = exes, []
        self._index: dict = {}  # [name, kind, short] -> its place in table
        self._at: dict = {}  # id(frame dict) -> its place in table
        self._kept: list = []  # (the dicts: an id stays its own while it is known)
        # (function, module) -> its place in table, for a native frame with a name: its row
        # is the same at each of its return addresses (55,000 dicts, a few thousand names).
        self._named: dict = {}

    def stack(self, frames: list) -> list[int]:
        out = list(map(self._at.get, map(id, reversed(frames))))  # (no Python loop a frame)
        if None not in out:
            return out
        for f in reversed(frames):  # (root first: the table in the order a reader meets it)
            if id(f) not in self._at:
                named = (f["function"], f["module"]) if f["function"] and "kind" not in f \
                    else None
                at = self._named.get(named) if named else None
                if at is None:
                    at = self._place(f)
                    if named:
                        self._named[named] = at
                self._at[id(f)] = at
                self._kept.append(f)
        return list(map(self._at.__getitem__, map(id, reversed(frames))))

    def _place(self, f: dict) -> int:
        """The place in table of a frame's row, the row added if it is new."""
        name = frame_name(f)
        row = (name, frame_kind(f, self.exes), short(f["function"]) if f.get("function") else name)
        at = self._index.get(row)
        if at is None:
            at = self._index[row] = len(self.table)
            self.table.append(row)
        return at


def flame_json(flames: FlameFrames, rows: list) -> str:
    """The flame graph's data, to sit in a <script> element: its frames and its stacks, each
    [frame indices, weight...], stacks of the same frames as one (merged())."""
    return json.dumps({"frames": flames.table, "stacks": merged(rows)},
                      separators=(",", ":")).replace("</", "<\\/")


def merged(rows: list) -> list:
    """Flame graph rows [frame indices, weight...] of the same frames summed into one, in the
    order first seen. The graph draws functions: stacks that differ only in the lines or call
    sites of their frames draw the same boxes, and the page sums them anyway (a Python
    program's import: 349,000 stacks, most of them differing only in lines)."""
    out: dict = {}
    for ids, *weights in rows:
        got = out.get(tuple(ids))
        if got is None:
            out[tuple(ids)] = [ids, *weights]
        else:
            for i, w in enumerate(weights, 1):
                got[i] += w
    return list(out.values())


def _count(n: int) -> str:
    return f"{n:,}"


def _share(x: float) -> str:
    return f"{x:.0%}"


# The behaviour sections: (report key, title, what it means, columns: header, key, format).
# {threshold} in a title: the report's transient threshold.
TABLES = (
    ("transient", "Transient allocations (freed within {threshold})",
     "Stacks whose blocks are freed soon after they are allocated: each one an allocator round "
     "trip that a stack buffer or a reused block would save.",
     (("allocations", "alloc_count", _count), ("freed quickly", "transient_count", _count),
      ("share freed quickly", "transient_share", _share),
      ("too quiet to time that finely", "unclassified_count", _count),
      ("freed before the thread's next allocation", "temporary_share", _share),
      ("freed by the call that allocated", "same_call_share", _share))),
    ("thread_locality", "Freed by another thread",
     "Stacks whose blocks another thread frees: allocator traffic between threads.",
     (("allocations", "alloc_count", _count),
      ("freed by the same thread", "same_thread_share", _share),
      ("freed by another thread", "other_thread_share", _share),
      ("still live", "live_share", _share))),
)


def _snapshots_html(snaps: list | None) -> list[str]:
    """The snapshots the capture holds (SIGUSR1, memhook snapshot, --snapshot-when), and how to
    report on one."""
    if not snaps:
        return []
    rows = "".join(f"<tr><td class='num' data-v='{x['number']}'>{x['number']}</td>"
                   f"<td class='num' data-v='{x['time_s']}'>{x['time_s']:.3f} s</td>"
                   f"<td>{html.escape(x['reason'])}</td>"
                   f"<td class='num' data-v='{x['outstanding_bytes']}'>"
                   f"{human_bytes(x['outstanding_bytes'])}</td>"
                   f"<td class='num' data-v='{x['outstanding_count']}'>{x['outstanding_count']}</td>"
                   f"<td class='num' data-v='{x['rss_bytes']}'>{human_bytes(x['rss_bytes'])}</td>"
                   "</tr>" for x in snaps)
    return ["<h2>Snapshots</h2><p class='why'>The heap as it was at each: "
            "<code>memhook report FILE --snapshot N</code>, and what changed between two: "
            "<code>--snapshot N --diff M</code>.</p><table class='sortable' id='snapshots'><tr>"
            "<th class='num'>#</th><th class='num'>after attach</th><th>why</th>"
            "<th class='num'>outstanding</th><th class='num'>blocks</th><th class='num'>RSS</th>"
            "</tr>" + rows + "</table>"]


def _stack_html(row: dict) -> str:
    """A stack in a table: its one line (the leak's own frame, short names) and, on a click,
    its frames in full (all of them: the page works offline, nothing is fetched)."""
    frames = row["frames"]
    lines = [html.escape(frame_text(f)) for f in frames]
    return ("<details class='stack'><summary>" + html.escape(leak_site(row)) + "</summary><pre>"
            + "\n".join(lines) + "</pre></details>")


def _resident_html(report: dict) -> list[str]:
    """The resident memory as a bar of its parts (widths: resident bytes) and their table;
    the heap census and the program's mappings as the text report words them."""
    res = report.get("resident_memory")
    out = []
    if res and res.get("parts"):
        rss = sum(p["rss_bytes"] for p in res["parts"]) or 1
        out.append(f"<h2>Resident memory</h2><p class='why'>At {res['when']}: every part of "
                   f"the process's {human_bytes(rss)} resident (smaps), summing to it.</p>"
                   "<div id='rss'>")
        for p in res["parts"]:
            if p["rss_bytes"] * 1000 >= rss:
                out.append(f"<div style='width:{100 * p['rss_bytes'] / rss:.3f}%;background:"
                           f"{RESIDENT_COLOURS.get(p['kind'], '#999')}' title='"
                           f"{html.escape(p['part'], quote=True)}: "
                           f"{human_bytes(p['rss_bytes'])}'></div>")
        out.append("</div><table><tr><th>part</th><th class='num'>resident</th>"
                   "<th class='num'>private dirty</th><th class='num'>swap</th></tr>")
        for p in res["parts"]:
            out.append(f"<tr><td><span class='key' style='background:"
                       f"{RESIDENT_COLOURS.get(p['kind'], '#999')}'></span>"
                       f"{html.escape(p['part'])}</td>"
                       f"<td class='num'>{human_bytes(p['rss_bytes'])}</td>"
                       f"<td class='num'>{human_bytes(p['private_dirty_bytes'])}</td>"
                       f"<td class='num'>{human_bytes(p['swap_bytes'])}</td></tr>")
        out.append("</table>")
    census = census_lines(report.get("heap_census"))
    if census:
        out.append("<h2>Held before attach</h2><p class='why'>glibc malloc's heap, walked from "
                   "outside while the process ran: the blocks it held when memhook attached, "
                   "and the allocator's own share.</p>"
                   f"<pre>{html.escape(chr(10).join(census))}</pre>")
    mappings = mapping_lines(report.get("mappings"))
    if mappings:
        out.append("<h2>Anonymous mmap</h2>"
                   f"<pre>{html.escape(chr(10).join(mappings))}</pre>")
    return out


def render(cap: Capture, report: dict, symbolizer, figures=None, **_) -> str:
    """`figures`: a plots_beside.Beside started before the model was built (the plots drawn
    meanwhile in a child process), or None: drawn here."""
    t = report["totals"]
    if figures is None:
        from . import plots
        drawn = plots.render(cap, report, symbolizer, "svg")
    else:
        figures.ask(report)  # (the child draws while the page is written)
    procs = report.get("processes")
    who = f"{len(procs)} processes" if procs else f"PID {report['pid']}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>memhook report: "
             f"{who}</title><style>{STYLE}</style></head><body>",
             f"<h1>memhook report: {who}</h1>",
             f"<p>{html.escape(str(report['command']))} — "
             + (f"{html.escape(report['libc'])}, " if report.get("libc") and not procs else "")
             + f"{report['duration_s']} s traced"
             + (" (capture cut off)" if report.get("incomplete") else "") + "</p>",
             "<table>"]
    for label, value in (("outstanding", f"{human_bytes(t['outstanding_bytes'])} in "
                                         f"{t['outstanding_count']} blocks"),
                         ("allocated", f"{human_bytes(t['alloc_bytes'])} in {t['alloc_count']} "
                                       "blocks"),
                         ("freed", f"{human_bytes(t['free_bytes'])} in {t['free_count']} blocks"),
                         ("unknown frees", t["unknown_free_count"]),
                         ("dropped events", f"{t['dropped_events']} (frees among them: "
                                            f"{t['dropped_frees']})")):
        parts.append(f"<tr><th>{label}</th><td>{value}</td></tr>")
    for line in abandoned_lines(report) + dropped_frees_lines(t):
        parts.append(f"<tr><th></th><td>{html.escape(line.strip())}</td></tr>")
    for n, line in enumerate(leak_check_lines(report.get("leak_check"))):
        parts.append(f"<tr><th>{'leak check' if not n else ''}</th><td>"
                     f"{html.escape(line.strip().removeprefix('leak check'))}</td></tr>")
    pm = report.get("process_memory")
    if pm:
        text = process_memory_text(pm, explained=bool(report.get("resident_memory")
                                                       and census_ok(report)))
        parts.append(f"<tr><th>process</th><td>{html.escape(text)}</td></tr>")
    parts.append("</table>")
    if procs:
        parts.append("<h2>Processes</h2><p class='why'>Growing first: how fast each process's "
                     "leak suspects accumulate at the end of its capture, and the first of "
                     "them. Below, every table is the merged view: stacks matched by build-id "
                     "and offset across processes.</p><table><tr><th>PID</th><th>command</th>"
                     "<th class='num'>outstanding</th><th class='num'>growth at the end</th>"
                     "<th>first suspect</th></tr>")
        for r in procs:
            first = r.get("top_suspect")
            parts.append(f"<tr><td>{r['pid']}</td><td>{html.escape(str(r['command']))}</td>"
                         f"<td class='num'>{human_bytes(r['outstanding_bytes'])}</td>"
                         f"<td class='num'>{human_bytes(r['growth_bytes_per_min'])}/min</td>"
                         f"<td>{_stack_html(first) if first else ''}</td></tr>")
        parts.append("</table>")
    parts += _resident_html(report)
    checked = bool((report.get("leak_check") or {}).get("totals"))
    parts.append("<h2>Leak suspects</h2><p class='why'>"
                 + ("Stacks with blocks no pointer reaches (the leak check) first, then r"
                    if checked else "R")
                 + "anked by how fast their live blocks "
                 "accumulate at the end of the capture (the level their outstanding bytes return "
                 "to, robust slope over the last third); caches that filled and memory held "
                 "follow by size. Memory freed as it is used (per request, per query) is not "
                 "listed.</p><table class='sortable' id='suspects'>"
                 "<tr><th>#</th><th class='num'>outstanding</th>"
                 + ("<th class='num'>lost</th>" if checked else "")
                 + "<th class='num'>growth at the end</th><th>why</th><th>stack</th></tr>")
    for n, r in enumerate(report.get("leak_suspects", []), 1):
        parts.append(f"<tr><td>{n}" + (f"<br>PID {r['pid']}" if "pid" in r else "") + "</td>"
                     f"<td class='num' data-v='{r['outstanding_bytes']}'>"
                     f"{human_bytes(r['outstanding_bytes'])}</td>"
                     + (f"<td class='num' data-v='{r.get('lost_bytes', 0)}'>"
                        f"{human_bytes(r.get('lost_bytes', 0))}</td>" if checked else "") +
                     f"<td class='num' data-v='{r['late_growth_bytes_per_min']}'>"
                     f"{human_bytes(r['late_growth_bytes_per_min'])}/min</td>"
                     f"<td class='why'>{'<br>'.join(html.escape(x) for x in r['reasons'])}</td>"
                     f"<td>{_stack_html(r)}</td></tr>")
    parts.append("</table>")
    unsaid = report.get("not_suspects") or []
    if unsaid:  # (each holds over a tenth of the outstanding bytes)
        parts.append("<p class='why'>Not suspects, though each holds over a tenth of the "
                     "outstanding bytes:</p><ul id='not-suspects'>" + "".join(
                         f"<li>{human_bytes(r['outstanding_bytes'])}: {_stack_html(r)} "
                         f"{html.escape(r['why'])}</li>" for r in unsaid) + "</ul>")
    parts.append(("<h2>Over time</h2>", "outstanding_over_time", "growth"))  # (filled below)
    parts += _snapshots_html(report.get("snapshots"))
    parts.append("<h2>Flame graph of outstanding bytes</h2><div id='flame-controls'>"
                 "<input type='search' id='flame-search' placeholder='search frames'> "
                 + "".join(f"<label><input type='radio' name='flame-weight' value='{v}'> {t}"
                           "</label> " for v, t in (("outstanding", "outstanding bytes"),
                                                    ("allocated", "bytes allocated"),
                                                    ("count", "blocks allocated")))
                 + "&nbsp; " + "".join(f"<span class='key' style='background:{c}'></span>{t} "
                                       for c, t in zip(KIND_COLOURS, KIND_NAMES))
                 + "</div><div id='crumb'></div><div id='flame'></div>")
    flames = FlameFrames(report_executable(cap))
    folded = [[flames.stack(s["frames"]), s["outstanding_bytes"], s["alloc_bytes"],
               s["alloc_count"]] for s in report["sites"] if s["alloc_count"] > 0]
    parts.append("<script id='flame-data' type='application/json'>"
                 + flame_json(flames, folded) + "</script>")
    peak = report.get("peak")
    if peak:
        held = [[flames.stack(s["frames"]), s["peak_bytes"]]
                for s in report["sites"] if s.get("peak_bytes")]
        parts.append(f"<h2>Flame graph at the peak</h2><p class='why'>{human_bytes(peak['bytes'])}"
                     f" outstanding {peak['time_s']:.3f} s after attach"
                     + (" (estimated)" if peak["estimated"] else "")
                     + (f"; the process's peak RSS {human_bytes(peak['vm_hwm_bytes'])}"
                        if peak.get("vm_hwm_bytes") else "")
                     + ": the stacks that held it then.</p><div id='peak-crumb'></div>"
                     "<div id='peak-flame'></div><script id='peak-data' type='application/json'>"
                     + flame_json(flames, held) + "</script>")
    parts.append(("<h2>Sizes and lifetimes</h2>", "histograms"))
    for key, title, why, columns in TABLES:
        rows = report.get(key, [])
        if not rows:
            continue
        title = title.format(threshold=duration_text(report.get("transient_threshold_ns", 1e6)))
        parts.append(f"<h2>{title}</h2><p class='why'>{why}</p>"
                     f"<table class='sortable' id='{key}'><tr>"
                     + "".join(f"<th class='num'>{html.escape(c)}</th>" for c, _, _ in columns)
                     + "<th>stack</th></tr>")
        for r in rows:
            parts.append("<tr>" + "".join(f"<td class='num' data-v='{r[k]}'>{fmt(r[k])}</td>"
                                          for _, k, fmt in columns)
                         + f"<td>{_stack_html(r)}</td></tr>")
        parts.append("</table>")
    parts.append(f"<script>const KIND_NAMES = {json.dumps(KIND_NAMES)}, KIND_COLOURS = "
                 f"{json.dumps(KIND_COLOURS)};{SCRIPT}</script></body></html>")
    svg = {k: v.decode().split("?>", 1)[-1]  # (without their XML headers)
           for k, v in (drawn if figures is None else figures.result()).items()}
    return "\n".join(p if isinstance(p, str) else p[0] + "".join(svg[k] for k in p[1:])
                     for p in parts)
