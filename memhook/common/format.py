"""Words for numbers and frames, shared by every view (reports, live view, plots, analysis):
bytes and durations in their unit, a frame's one name, a line a terminal shows as one line.
The bottom of the package: it imports only its neighbours in common/ (attribution, short_names),
and those where a stack is named."""
from __future__ import annotations

import os
import re


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """A size as people write it (1024, 64K, 2MiB, 1.5GiB; binary units), or None."""
    m = SIZE.match(text)
    if not m:
        return None
    return int(float(m.group(1)) * 1024 ** "bkmgt".index((m.group(2) or "b").lower()))


def count_text(n: float) -> str:
    """A count in thousands, millions or billions (1k, 250k, 1.5M), three significant digits."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def duration_text(ns: float) -> str:
    """A duration in the largest unit it fills, three significant digits."""
    for unit, scale in (("h", 3600e9), ("min", 60e9), ("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def frame_name(f: dict) -> str:
    """A frame's one name, in every view: its function, else module+offset (what addr2line
    takes), else the bare address (code in no file, such as JIT code)."""
    if f["function"]:
        return f["function"]
    return f"{os.path.basename(f['module'])}+0x{f['offset']:x}" if f["module"] else f["address"]


def frame_text(f: dict) -> str:
    where = frame_name(f)
    if f.get("inlined"):
        where = "(inlined) " + where
    if f.get("unwound"):  # (its caller found by rows derived from its machine code)
        where += f" [{f['unwound']}]"
    if f["file"]:  # (a file without line rows: a unit built without -g, its name from DWARF)
        return f"{where}  {f['file']}" + (f":{f['line']}" if f.get("line") else "")
    if f["module"]:
        return f"{where}  ({os.path.basename(f['module'])})"
    return where


LEAK_FRAME_LABEL = "memhook.leak_frame"  # pprof sample label, OTLP sample attribute


def _attributed_index(r: dict, rules=None) -> int:
    """The index of a stack's attributed frame: as the report gives it, else by `rules`
    (attribution.py; the defaults where None). The stack has frames."""
    from .attribution import DEFAULT, attributed
    at = r.get("attributed_frame")
    return attributed(r["frames"], rules or DEFAULT) if at is None else at


def leak_frame(r: dict) -> str:
    """A stack's attributed frame alone, short name and file:line (or module): the label pprof
    and OTLP samples carry, so that a profile viewer can group by the frame to fix."""
    from .short_names import short
    if not r.get("frames"):
        return "?"
    f = r["frames"][_attributed_index(r)]
    return frame_text({**f, "function": short(f["function"]) if f.get("function") else None,
                       "inlined": False})


def leak_site(r: dict, rules=None, full_names: bool = False, width: int | None = None) -> str:
    """A stack as one line names it (issue 35): its attributed frame (the one a person would
    fix) with file:line, then the runtime frames it called into, in short names
    (short_names.py: two frames of the line that would read the same keep their parameters)
    unless `full_names`. `rules`: attribution.Rules where the stack has no attributed_frame.
    `width`: the room it has; beyond it the path into the runtime is left out, then the
    file's directories."""
    from .attribution import path_into_runtime
    from .short_names import Shortener
    frames = r.get("frames") or []
    if not frames:
        return "?"
    at = _attributed_index(r, rules)
    shown = path_into_runtime(frames, at) + [frames[at]]
    shorten = Shortener((f.get("function") for f in shown if f.get("kind") != "python"),
                        full=full_names)

    def named(f):  # (a Python frame's qualified name is short already: Class.method.<locals>)
        return f if f.get("kind") == "python" else {**f, "function": shorten(f.get("function"))}
    via = [frame_name(named(f)) for f in shown[:-1]]
    line = frame_text(named(frames[at])) + (f"  (via {' <- '.join(via)})" if via else "")
    if width and len(line) > width:  # the path into the runtime goes first, then the file's
        line = frame_text(named(frames[at]))     # directories
        if len(line) > width and frames[at].get("file"):
            line = frame_text({**named(frames[at]), "file": os.path.basename(frames[at]["file"])})
    return line


def distinct_labels(stacks: list, width: int = 40) -> list[str]:
    """A label per stack (frames, call site first) that tells it from the others: its
    attributed frame (the leak's own, attribution.py) in its short name, and where another
    stack shares that, the first frame where the two part ("leaf ← … ← caller"); stacks alike
    from there up, by the runtime function each called ("leaf (via std::string::append)", or
    "leaf" for the one that called none).
    Stacks alike in both get their rank."""
    from .attribution import attributed
    from .short_names import short

    def name(f):
        return short(f["function"]) if f.get("function") else frame_name(f)
    starts = [attributed(s) for s in stacks]
    names = [[name(f) for f in s[at:]] for s, at in zip(stacks, starts)]
    via = [name(s[at - 1]) if at > 0 else None for s, at in zip(stacks, starts)]

    def cut(name: str) -> str:
        return name if len(name) <= width else name[:width - 1] + "…"

    labels = []
    for i, s in enumerate(names):
        if not s:
            labels.append("[no frames]")
            continue
        shared = max((next((k for k, (a, b) in enumerate(zip(s, o)) if a != b), min(len(s), len(o)))
                      for j, o in enumerate(names) if j != i), default=0)
        if shared == 0:
            labels.append(cut(s[0]))
        elif shared < len(s):
            labels.append(f"{cut(s[0])} ← {'… ← ' if shared > 1 else ''}{cut(s[shared])}")
        elif not any(o == s and via[j] == via[i] for j, o in enumerate(names) if j != i):
            labels.append(cut(s[0]) + (f" (via {cut(via[i])})" if via[i] else ""))
        else:
            labels.append(f"{cut(s[0])} (stack {i + 1})")
    return labels


def one_line(text: str, limit: int = 100) -> str:
    """A command line as one line of a terminal: control characters (a newline in `python -c`'s
    program, or an escape sequence a target put in its argv) shown escaped, long ones cut."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 1] + "…"
