"""JIT frames from perf maps (symbolize/jit_frames.py, capture/perf_map.py, attribution's JIT
rule): the formats runtimes write, overlapping entries, the runtime's own code."""
import os

from memhook.capture import perf_map
from memhook.common import attribution
from memhook.inject import target_files
from memhook.symbolize import jit_frames


def test_a_later_entry_wins_where_ranges_overlap():
    m = perf_map.JitMap([[0x1000, 0x100, "old"], [0x2000, 0x10, "other"],
                           [0x1080, 0x40, "new"]])
    assert m.at(0x1090)[2] == "new" and m.at(0x1010)[2] == "old"
    assert m.at(0x10c0)[2] == "old" and m.at(0x2010) is None and m.at(0xfff) is None


def test_names_as_runtimes_write_them():
    v8 = jit_frames.frame_dict(0x10, [0x0, 0x40, "JS:*leakyHandler /srv/app.js:12:20"])
    assert (v8["function"], v8["file"], v8["line"], v8["kind"]) == (
        "leakyHandler", "/srv/app.js", 12, "jit")
    old_v8 = jit_frames.frame_dict(0x10, [0x0, 0x40, "LazyCompile:~handle file:///srv/a.js:3"])
    assert (old_v8["function"], old_v8["file"], old_v8["line"]) == ("handle", "/srv/a.js", 3)
    anonymous = jit_frames.frame_dict(0x10, [0x0, 0x40, "JS:~ /srv/app.js:7:1"])
    assert anonymous["file"] == "/srv/app.js" and anonymous["line"] == 7
    hotspot = jit_frames.frame_dict(0x10, [0x0, 0x40, "void LeakDemo.keep(int, boolean)"])
    assert hotspot["function"] == "void LeakDemo.keep(int, boolean)" and hotspot["file"] is None
    python = jit_frames.frame_dict(0x10, [0x0, 0x40, "py::leak_here:/srv/app.py"])
    assert (python["function"], python["file"]) == ("leak_here", "/srv/app.py")
    builtin = jit_frames.frame_dict(0x10, [0x0, 0x40, "Builtin:CallFunction"])
    assert builtin["function"] == "Builtin:CallFunction" and builtin["offset"] == 0x10


def test_the_attributed_frame_is_the_programs_first_compiled_frame():
    def jit(name, file=None):
        return {"function": name, "module": None, "file": file, "line": 1, "kind": "jit",
                "jit_name": name}
    frames = [{"function": "node::Buffer::New", "module": "/usr/bin/node", "file": None},
              jit("Builtin:TypedArrayConstructor"), jit(jit_frames.UNLISTED),
              jit("FastBuffer", "node:internal/buffer"), jit("void java.util.ArrayList.add()"),
              jit("leakyHandler", "/srv/app.js")]
    assert attribution.attributed(frames) == 5
    # Without a frame of the program's own among them, the native rule decides.
    assert attribution.attributed(frames[:5]) == 0


def test_perf_map_lines_and_a_map_older_than_the_process(tmp_path, monkeypatch):
    assert perf_map.parse(b"1000 40 JS:*f /a.js:1:2\nbad line\n2000 zz x\n3000 8\n") == [
        [0x1000, 0x40, "JS:*f /a.js:1:2"], [0x3000, 0x8, ""]]
    # A map read through the target's root: this process's own, once written after its start.
    pid = os.getpid()
    monkeypatch.setattr(perf_map, "path_in_target", lambda p: str(tmp_path / "perf.map"))
    monkeypatch.setattr(target_files, "open_dir_in_root",  # (perf_map imports it when called)
                        lambda p, where: os.open(tmp_path, os.O_PATH | os.O_DIRECTORY))
    (tmp_path / "perf.map").write_text("1000 40 a\n2000 40 b\n3000 40 c")  # (the last unfinished)
    m = perf_map.PerfMap()
    assert [e[2] for e in perf_map.read_new(pid, m)] == ["a", "b"]
    with open(tmp_path / "perf.map", "a") as f:
        f.write("\n")
    assert [e[2] for e in perf_map.read_new(pid, m)] == ["c"]
    (tmp_path / "perf.map").write_text("4000 40 d\n")  # written again from its start
    assert [e[2] for e in perf_map.read_new(pid, m)] == ["d"] and m.rewritten
    assert [e[2] for e in m.entries] == ["d"]
    os.utime(tmp_path / "perf.map", (1, 1))  # before this process started: another's
    assert perf_map.read_new(pid, perf_map.PerfMap()) == []


def test_the_flame_graph_colours_python_and_jit_frames_as_their_own():
    from memhook.reporters.html import KIND_NAMES, frame_kind
    python = {"function": "leak_here", "module": None, "file": "/srv/app.py", "kind": "python"}
    stdlib = dict(python, file="/usr/lib/python3.11/json/encoder.py")
    jit = {"function": "leakyHandler", "module": None, "file": "/srv/app.js", "kind": "jit",
           "jit_name": "JS:*leakyHandler /srv/app.js:2:1"}
    builtin = dict(jit, function="Builtin:CallFunction", jit_name="Builtin:CallFunction")
    assert [KIND_NAMES[frame_kind(f, set())] for f in (python, stdlib, jit, builtin)] == [
        "Python code", "the runtime", "JIT-compiled code", "the runtime"]


def test_merged_processes_keep_their_jit_frames_apart():
    """Two processes' JIT code at the same address: each frame moves with its process's map."""
    import numpy as np
    from memhook.capture import Capture, merge
    caps = []
    for name in ("handlerA", "handlerB"):
        cap = Capture(meta={"pid": len(caps) + 1}, modules=[],
                      sites={k: np.array([0, 1], np.uint64) for k in (
                          "alloc_count", "alloc_bytes", "free_count", "free_bytes",
                          "outstanding_count", "outstanding_bytes", "op_mask",
                          "uncertain_count", "uncertain_bytes")},
                      stack_offsets=np.array([0, 0, 1], np.uint64),
                      stack_frames=np.array([0x7f0000001010], np.uint64),
                      jit_map={"entries": [[0x7f0000001000, 0x100, f"JS:*{name} /a.js:1:1"]]})
        caps.append(cap)
    m = merge(caps)
    from memhook.symbolize import Symbolizer, stack_frames
    sym = Symbolizer([]).use(m)
    names = sorted(stack_frames(sym, m.frames(s))[0]["function"] for s in (1, 2))
    assert names == ["handlerA", "handlerB"]
