"""One self-contained HTML file: summary, ranked leak suspects with their stacks, the plots as
inline SVG, and an interactive flame graph of outstanding bytes. No network fetches."""
from __future__ import annotations

import html
import json

from . import plots
from ..capture import Capture
from ..format import duration_text, frame_name, frame_text, human_bytes, leak_site
from .text import (census_lines, census_ok, dropped_frees_lines, mapping_lines,
                   process_memory_text)

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}.num{text-align:right}
pre{margin:2px 0;font-size:12px;white-space:pre-wrap}.why{color:#555;font-size:12px}
#flame,#peak-flame{position:relative;width:100%;font-size:11px}
#flame div,#peak-flame div{position:absolute;height:17px;overflow:hidden;white-space:nowrap;box-sizing:border-box;
border:1px solid #fff;background:#e8864a;cursor:pointer;padding:0 3px;color:#000}
#flame div:hover,#peak-flame div:hover{background:#f2b07f}
#crumb,#peak-crumb{margin:6px 0;font-size:12px;color:#555}
svg{max-width:100%;height:auto}
#rss{display:flex;width:100%;height:28px;border:1px solid #999;margin:8px 0}
#rss div{height:100%;box-sizing:border-box;border-right:1px solid #fff}
.key{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:middle}
"""

# An icicle: the root on top, callees below; widths are outstanding bytes. Click to zoom into a
# frame, click the top bar to zoom out.
SCRIPT = """
function fmt(b) { const u = ['B','KiB','MiB','GiB']; let i = 0;
  while (b >= 1024 && i < 3) { b /= 1024; i++; } return (i ? b.toFixed(1) : b) + ' ' + u[i]; }
function flame(dataId, boxId, crumbId) {
  const data = JSON.parse(document.getElementById(dataId).textContent);
  const root = {name: 'all', value: 0, children: {}};
  for (const [stack, value] of data) {
    let node = root; root.value += value;
    for (const name of stack) {
      node = node.children[name] = node.children[name] || {name, value: 0, children: {}};
      node.value += value;
    }
  }
  const box = document.getElementById(boxId), crumb = document.getElementById(crumbId);
  function draw(top, path) {
    box.innerHTML = ''; let depth = 0;
    const width = box.clientWidth;
    function place(node, x, w, d) {
      if (w < 2) return;
      const el = document.createElement('div');
      el.style.left = x + 'px'; el.style.width = w + 'px'; el.style.top = (d * 18) + 'px';
      el.textContent = node.name; el.title = node.name + ' — ' + fmt(node.value);
      el.onclick = () => draw(node === top ? (path.length ? path[path.length - 1][0] : root) : node,
                              node === top ? path.slice(0, -1) : path.concat([[top]]));
      box.appendChild(el); depth = Math.max(depth, d);
      let cx = x;
      for (const c of Object.values(node.children).sort((a, b) => b.value - a.value)) {
        const cw = w * c.value / node.value; place(c, cx, cw, d + 1); cx += cw;
      }
    }
    place(top, 0, width, 0);
    box.style.height = ((depth + 1) * 18) + 'px';
    crumb.textContent = top === root ? 'Click a frame to zoom in.' :
        'Zoomed into ' + top.name + ' (' + fmt(top.value) + '); click the top bar to zoom out.';
  }
  draw(root, []);
}
flame('flame-data', 'flame', 'crumb');
if (document.getElementById('peak-data')) flame('peak-data', 'peak-flame', 'peak-crumb');
"""


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


def _stack_html(row: dict, _shown: int = 10) -> str:
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
                           f"{plots.KIND_COLOURS.get(p['kind'], '#999')}' title='"
                           f"{html.escape(p['part'], quote=True)}: "
                           f"{human_bytes(p['rss_bytes'])}'></div>")
        out.append("</div><table><tr><th>part</th><th class='num'>resident</th>"
                   "<th class='num'>private dirty</th><th class='num'>swap</th></tr>")
        for p in res["parts"]:
            out.append(f"<tr><td><span class='key' style='background:"
                       f"{plots.KIND_COLOURS.get(p['kind'], '#999')}'></span>"
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


def render(cap: Capture, report: dict, symbolizer, **_) -> str:
    t = report["totals"]
    figures = plots.render(cap, report, symbolizer, "svg")
    svg = {k: v.decode().split("?>", 1)[-1] for k, v in figures.items()}  # drop XML headers
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
    for line in dropped_frees_lines(t):
        parts.append(f"<tr><th></th><td>{html.escape(line.strip())}</td></tr>")
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
                         f"<td>{_stack_html(first, 4) if first else ''}</td></tr>")
        parts.append("</table>")
    parts += _resident_html(report)
    parts.append("<h2>Leak suspects</h2><p class='why'>Ranked by how fast their live blocks "
                 "accumulate at the end of the capture (the level their outstanding bytes return "
                 "to, robust slope over the last third); caches that filled and memory held "
                 "follow by size. Memory freed as it is used (per request, per query) is not "
                 "listed.</p><table>"
                 "<tr><th>#</th><th class='num'>outstanding</th><th class='num'>growth at the "
                 "end</th><th>why</th><th>stack</th></tr>")
    for n, r in enumerate(report.get("leak_suspects", []), 1):
        parts.append(f"<tr><td>{n}" + (f"<br>PID {r['pid']}" if "pid" in r else "") + "</td>"
                     f"<td class='num'>{human_bytes(r['outstanding_bytes'])}</td>"
                     f"<td class='num'>{human_bytes(r['late_growth_bytes_per_min'])}/min</td>"
                     f"<td class='why'>{'<br>'.join(html.escape(x) for x in r['reasons'])}</td>"
                     f"<td>{_stack_html(r)}</td></tr>")
    parts.append("</table>")
    parts.append(f"<h2>Over time</h2>{svg['outstanding_over_time']}{svg['growth']}")
    parts.append("<h2>Flame graph of outstanding bytes</h2><div id='crumb'></div>"
                 "<div id='flame'></div>")
    folded = [[[frame_name(f) for f in reversed(s["frames"])],
               s["outstanding_bytes"]] for s in report["sites"] if s["outstanding_bytes"] > 0]
    parts.append("<script id='flame-data' type='application/json'>"
                 + json.dumps(folded).replace("</", "<\\/") + "</script>")
    peak = report.get("peak")
    if peak:
        held = [[[frame_name(f) for f in reversed(s["frames"])], s["peak_bytes"]]
                for s in report["sites"] if s.get("peak_bytes")]
        parts.append(f"<h2>Flame graph at the peak</h2><p class='why'>{human_bytes(peak['bytes'])}"
                     f" outstanding {peak['time_s']:.3f} s after attach"
                     + (" (estimated)" if peak["estimated"] else "")
                     + (f"; the process's peak RSS {human_bytes(peak['vm_hwm_bytes'])}"
                        if peak.get("vm_hwm_bytes") else "")
                     + ": the stacks that held it then.</p><div id='peak-crumb'></div>"
                     "<div id='peak-flame'></div><script id='peak-data' type='application/json'>"
                     + json.dumps(held).replace("</", "<\\/") + "</script>")
    parts.append(f"<h2>Sizes and lifetimes</h2>{svg['histograms']}")
    for key, title, why, columns in TABLES:
        rows = report.get(key, [])
        if not rows:
            continue
        title = title.format(threshold=duration_text(report.get("transient_threshold_ns", 1e6)))
        parts.append(f"<h2>{title}</h2><p class='why'>{why}</p><table><tr>"
                     + "".join(f"<th class='num'>{html.escape(c)}</th>" for c, _, _ in columns)
                     + "<th>stack</th></tr>")
        for r in rows:
            parts.append("<tr>" + "".join(f"<td class='num'>{fmt(r[k])}</td>"
                                          for _, k, fmt in columns)
                         + f"<td>{_stack_html(r, 6)}</td></tr>")
        parts.append("</table>")
    parts.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(parts)
