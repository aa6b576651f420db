"""JIT-compiled frames named from the runtime's perf map (issue 45): Node.js with
--perf-basic-prof, and a JVM after `jcmd PID Compiler.perfmap`; without a map, the report says
how to get one."""
import shutil
import subprocess
from pathlib import Path

from conftest import Memhook, Target

JIT_TARGETS = Path(__file__).parent.parent / "targets" / "jit"
NODE = shutil.which("node") or "/usr/bin/node"
JDK = Path("/usr/lib/jvm/java-17-openjdk-amd64")


def text_report(capture) -> str:
    from conftest import report
    return report(capture).stdout


def marker_line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_node_functions_named_from_its_perf_map(tmp_path):
    """A JavaScript function that keeps Buffers: named with its file and line (the map gives
    where the function is defined), the stack's attributed frame, of kind jit."""
    script = tmp_path / "leaky_service.js"
    shutil.copy(JIT_TARGETS / "leaky_service.js", script)
    t = Target(script, argv=[NODE, "--perf-basic-prof", "--interpreted-frames-native-stack",
                             str(script)], cwd=tmp_path)
    try:
        mh = Memhook(t.pid, tmp_path)
        for _ in range(20):
            t.command("leak")
        rep = mh.stop()
        assert t.finish() == 0
    finally:
        t.kill()
    assert rep["jit"]["runtime"] == "node" and rep["jit"]["entries"] > 100, rep["jit"]
    buffers = [s for s in rep["sites"] if s["frames"] and s["outstanding_count"]
               and s["frames"][s["attributed_frame"]]["function"] == "leakyHandler"
               and 5000 <= s["outstanding_bytes"] / s["outstanding_count"] <= 5002]
    assert sum(s["outstanding_count"] for s in buffers) == 2000  # 20 x 100, none freed
    assert 2000 * 5000 <= sum(s["outstanding_bytes"] for s in buffers) <= 2000 * 5002
    at = buffers[0]["frames"][buffers[0]["attributed_frame"]]
    assert at["kind"] == "jit" and at["file"] == str(script)
    assert at["line"] == marker_line(JIT_TARGETS / "leaky_service.js", "function leakyHandler")
    # V8's own code (Builtins) and Node's internal modules are not the attributed frame.
    names = [f["function"] for f in buffers[0]["frames"]]
    assert names.index("leakyHandler") > 0 and "alloc" in names[:names.index("leakyHandler")]
    assert "leakyHandler  " in text_report(mh.capture)


def jvm(tmp_path):
    shutil.copy(JIT_TARGETS / "LeakDemo.java", tmp_path)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", f"-I{JDK}/include",
                    f"-I{JDK}/include/linux", str(JIT_TARGETS / "leak_demo.c"), "-o",
                    str(tmp_path / "libleakdemo.so")], check=True)
    subprocess.run([str(JDK / "bin" / "javac"), "-d", str(tmp_path),
                    str(tmp_path / "LeakDemo.java")], check=True)
    return Target(tmp_path / "LeakDemo.class",
                  argv=[str(JDK / "bin" / "java"), "-XX:+PreserveFramePointer",
                        f"-Djava.library.path={tmp_path}", "-cp", str(tmp_path), "LeakDemo"],
                  cwd=tmp_path)


def test_jvm_methods_named_after_jcmd_compiler_perfmap(tmp_path):
    """The Java method that called into JNI is named once the JVM wrote its perf map; before
    it did, the report says how to get one, and names no frame it cannot."""
    t = jvm(tmp_path)
    try:
        t.command("warm")  # (compiled by the JIT before memhook comes)
        mh = Memhook(t.pid, tmp_path)
        t.command("leak")
        subprocess.run([str(JDK / "bin" / "jcmd"), str(t.pid), "Compiler.perfmap"], check=True,
                       capture_output=True, timeout=60)
        rep = mh.stop()
        mh2 = Memhook(t.pid, tmp_path)  # a second session: the map read again, whole
        t.command("leak")
        rep2 = mh2.stop()
        assert t.finish() == 0
    finally:
        t.kill()
    for r in (rep, rep2):
        assert r["jit"]["runtime"] == "jvm" and r["jit"]["entries"] > 50, r["jit"]
        [kept] = [s for s in r["sites"] if any(f["function"] == "keep_block" for f in s["frames"])]
        assert (kept["outstanding_bytes"], kept["outstanding_count"]) == (150000, 50)
        names = [f["function"] or "" for f in kept["frames"]]
        java = [f for f in kept["frames"] if f.get("kind") == "jit"
                and not (f["function"] or "").startswith("[")]
        assert any("LeakDemo." in f["function"] for f in java), names
        at = kept["frames"][kept["attributed_frame"]]
        assert at.get("kind") == "jit" and "LeakDemo." in at["function"], at
        assert names.index("keep_block") < names.index("Java_LeakDemo_keep") < \
            names.index(at["function"])


def test_jvm_without_a_perf_map_says_how_to_get_one(tmp_path):
    t = jvm(tmp_path)
    try:
        t.command("warm")
        mh = Memhook(t.pid, tmp_path)
        t.command("leak")
        rep = mh.stop()
        assert t.finish() == 0
    finally:
        t.kill()
    assert rep["jit"] == {"runtime": "jvm", "perf_map": "", "entries": 0}
    text = text_report(mh.capture)
    assert "JIT-compiled frames unnamed" in text and "jcmd PID Compiler.perfmap" in text
    [kept] = [s for s in rep["sites"] if any(f["function"] == "keep_block" for f in s["frames"])]
    assert kept["frames"][kept["attributed_frame"]]["function"] == "keep_block"
