"""JIT-compiled frames named from the runtime's perf map (capture/perf_map.py): an address in no
module, inside a piece of code the map lists, is that piece's frame, of kind "jit", with the
runtime's file and line where its name carries them. Where ranges overlap, the later entry wins
(code moved or compiled again), as perf reads a map.

Names as runtimes write them: V8 (Node.js) `JS:*leakyHandler /srv/app.js:12:20` (`*` optimized,
`~` not; `LazyCompile:` and `Function:` in older versions), `Builtin:...`, `Stub:...`; HotSpot
`LeakDemo::leakViaJni` and its own `Interpreter`, `StubRoutines::...`; CPython 3.12's -X perf
`py::leak_here:/srv/app.py`. (Which of them are the runtime's own: attribution.py.)"""
from __future__ import annotations

import re

KIND = "jit"
V8_KIND = re.compile(r"^(?:JS|LazyCompile|Function|Script|Eval):[*~^+]?")
WHERE = re.compile(r"^(?P<name>.*?)\s+(?:file://)?(?P<file>\S+?):(?P<line>\d+)(?::\d+)?$")
PYTHON_PERF = re.compile(r"^py::(?P<name>[^:]+):(?P<file>.+)$")


def frame_dict(address: int, entry: list) -> dict:
    """A JIT frame as reports hold frames (Frame.as_dict's keys, and its kind)."""
    start, _, raw = entry
    name, file, line = raw, None, None
    m = PYTHON_PERF.match(raw)
    if m:
        name, file = m.group("name"), m.group("file")
    else:
        stripped = V8_KIND.sub("", raw)
        m = WHERE.match(stripped)
        if m and not m.group("name").endswith(("(", "<")):
            name, file, line = m.group("name") or "(anonymous)", m.group("file"), \
                int(m.group("line"))
        else:
            name = stripped
    return {"address": f"0x{address:x}", "module": None, "offset": address - start,
            "function": name, "file": file, "line": line, "kind": KIND, "jit_name": raw}


UNLISTED = "[JIT code the perf map does not list]"


def unlisted(address: int) -> dict:
    """An address in no module of a process with a perf map: code the runtime compiled and did
    not list (V8's baseline code, a stub written after the map was read), said as such."""
    return {"address": f"0x{address:x}", "module": None, "offset": None, "function": UNLISTED,
            "file": None, "line": None, "kind": KIND}
