"""The leak check for CI (issue 34): LeakSanitizer's suppressions (by function, by module),
--fail-on-leak's exit code 23, "Suppressions used", and --print-suppressions fed back."""
from __future__ import annotations

import re
import signal
import subprocess

from conftest import TARGETS, Lines, build, memhook_cmd, run_memhook

SUPPRESSIONS = """# known leaks, as LeakSanitizer reads them
leak:leak_known

leak:libleakcheck.so
"""


def leak_check_target(tmp_path):
    lib = tmp_path / "libleakcheck.so"
    subprocess.run(["gcc", "-g", "-O0", "-shared", "-fPIC", str(TARGETS / "leak_check_lib.c"),
                    "-o", str(lib)], check=True)
    return build(tmp_path, "leak_check.c", flags=["-L", str(tmp_path),
                                                  f"-Wl,-rpath,{tmp_path}"],
                 libs=["-lleakcheck"])


def traced_run(tmp_path, target, *args) -> tuple[int, str, str]:
    """memhook -p with `args` while the target leaks, then Ctrl-C: (exit code, stdout, stderr)."""
    mh = subprocess.Popen(memhook_cmd("-p", target.pid, "--no-live", *args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    lines = Lines(mh.stdout)
    lines.expect("attached")
    target.command("leak")
    target.command("hold")  # (reachable: outstanding, not lost)
    mh.send_signal(signal.SIGINT)
    mh.wait(timeout=120)
    out = []
    while (line := lines._q.get(timeout=60)) is not None:  # (Lines reads standard output)
        out.append(line)
    return mh.returncode, "".join(out), mh.stderr.read()


def test_suppressions_and_fail_on_leak(tmp_path, targets):
    """Two of three leaks suppressed, one by function and one by module: --fail-on-leak above
    the third (300 bytes) passes, below it exits 23 (from -p and from report); the text says
    which suppressions matched what, as LSan prints it; a bad file is one line, exit 2."""
    supp = tmp_path / "known.supp"
    supp.write_text(SUPPRESSIONS)
    target = targets(leak_check_target(tmp_path))
    cap = tmp_path / "leaks.mh"
    code, out, err = traced_run(tmp_path, target, "-o", cap, "--suppressions", supp,
                                "--fail-on-leak=200")
    assert code == 23, (code, err)
    assert "Traceback" not in err
    assert re.search(r"^Suppressions used:\n  count      bytes template\n"
                     r"      5        500 leak_known\n      4       1000 libleakcheck\.so\n-+\n"
                     r"not suppressed: 748 bytes in 10 blocks, of which lost \(no pointer "
                     r"reaches them\): 300 bytes in 3 blocks$", out, re.M), out
    assert "[suppressed: leak:leak_known]" in out
    for threshold, want in (("300", 0), ("299", 23), ("1KiB", 0)):
        rep = run_memhook("report", cap, "--suppressions", supp, f"--fail-on-leak={threshold}")
        assert rep.returncode == want, (threshold, rep.returncode, rep.stderr)
    # Without suppressions, every leak counts: 1800 bytes lost (the 448 held are no leak)...
    assert run_memhook("report", cap, "--fail-on-leak=1799").returncode == 23
    assert run_memhook("report", cap, "--fail-on-leak=1800").returncode == 0
    # ... unless every outstanding byte counts, as before the leak check.
    assert run_memhook("report", cap, "--fail-on-leak=any-outstanding").returncode == 23
    assert run_memhook("report", cap, "--suppressions", supp,
                       "--fail-on-leak=any-outstanding").returncode == 23
    bad = tmp_path / "bad.supp"
    bad.write_text("leak:fine\nthis is not one\n")
    rep = run_memhook("report", cap, "--suppressions", bad)
    assert rep.returncode == 2 and re.fullmatch(
        r"memhook: .*bad\.supp:2: not a suppression \(KIND:PATTERN, such as leak:my_function\): "
        r"'this is not one'\n", rep.stderr), rep.stderr
    assert target.finish() == 0


def test_printed_suppressions_fed_back_suppress_everything(tmp_path, targets):
    """--print-suppressions writes one suppression per leaking stack (lost blocks: the held ones
    are no leak); fed back, nothing lost is left and --fail-on-leak passes; JSON says which
    matched what."""
    target = targets(leak_check_target(tmp_path))
    cap = tmp_path / "leaks.mh"
    code, _, err = traced_run(tmp_path, target, "-o", cap)
    assert code == 0, err
    printed = run_memhook("report", cap, "--print-suppressions")
    assert printed.returncode == 0, printed.stderr
    rules = [x for x in printed.stdout.splitlines() if x.startswith("leak:")]
    assert sorted(rules) == ["leak:leak_known", "leak:leak_new", "leak:lib_leak"], printed.stdout
    supp = tmp_path / "printed.supp"
    supp.write_text(printed.stdout)
    rep = run_memhook("report", cap, "--suppressions", supp, "--fail-on-leak", "--format", "json")
    assert rep.returncode == 0, rep.stderr
    import json
    report = json.loads(rep.stdout)
    assert report["unsuppressed"] == {"outstanding_bytes": 448, "outstanding_count": 7,
                                      "lost_bytes": 0, "lost_count": 0}
    assert sorted((s["pattern"], s["blocks"], s["bytes"]) for s in report["suppressions"]) == [
        ("leak_known", 5, 500), ("leak_new", 3, 300), ("lib_leak", 4, 1000)]
    assert target.finish() == 0
