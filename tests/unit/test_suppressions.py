"""LeakSanitizer's suppression patterns as memhook reads them (memhook/reporters/suppressions.py)."""
from __future__ import annotations

import pytest

from memhook.reporters import suppressions


def frames(*functions, module="/usr/lib/libfoo.so.1", file="/src/foo/bar.cc"):
    return [{"function": f, "module": module, "file": file} for f in functions]


@pytest.mark.parametrize("pattern,hit", [
    ("leak_known", True), ("known", True),            # anywhere in the name
    ("^leak_", True), ("^known", False),               # anchored at the start
    ("known$", True), ("leak$", False),                # at the end
    ("leak*known", True), ("^l*n$", True), ("k*z", False),
    ("libfoo.so", True), ("libfoo.so.2", False),       # the module
    ("foo/bar.cc", True), ("^/src/*.cc$", True),       # the source file
    ("leak.known", False),                             # '.' is a dot, not any character
])
def test_lsan_template_matching(pattern, hit):
    s = suppressions.Suppression(pattern, "t:1")
    assert s.matches(frames("main", "leak_known")) is hit


def test_parse_keeps_leaks_and_says_what_is_not_one():
    text = "# comment\n\nleak:a_b\n  leak:  spaced  \ncalled_from_lib:libx.so\nleak:\n"
    got = suppressions.parse(text, "f.supp")
    assert [(s.pattern, s.source) for s in got] == [("a_b", "f.supp:3"), ("spaced", "f.supp:4")]
    with pytest.raises(suppressions.SuppressionError, match=r"f\.supp:2: not a suppression"):
        suppressions.parse("leak:ok\nnot one\n", "f.supp")


def test_first_match_counts_and_the_rest_is_left():
    report = {"totals": {"outstanding_bytes": 60},
              "sites": [{"outstanding_bytes": 10, "outstanding_count": 1, "frames": frames("a")},
                        {"outstanding_bytes": 20, "outstanding_count": 2, "frames": frames("ab")},
                        {"outstanding_bytes": 30, "outstanding_count": 3, "frames": frames("c")},
                        {"outstanding_bytes": 0, "outstanding_count": 0, "frames": frames("a")}]}
    sups = suppressions.parse("leak:^a\nleak:zzz\n", "s")  # (zzz matches nothing: unlisted)
    suppressions.apply(report, sups)
    assert report["suppressions"] == [{"pattern": "^a", "source": "s:1", "blocks": 3,
                                       "bytes": 30}]
    assert report["unsuppressed"] == {"outstanding_bytes": 30, "outstanding_count": 3}
    outstanding = suppressions.FailOnLeak("outstanding", 29)
    assert suppressions.leaked(report, outstanding)
    assert not suppressions.leaked(report, outstanding._replace(threshold=30))
    # With the leak check, lost bytes count: the unsuppressed site has 12 lost of its 30.
    report["leak_check"] = {"totals": {"definitely_lost_bytes": 12}}
    report["sites"][2].update(definitely_lost_bytes=8, definitely_lost_count=1,
                              indirectly_lost_bytes=4, indirectly_lost_count=1)
    suppressions.apply(report, sups)
    assert report["unsuppressed"] == {"outstanding_bytes": 30, "outstanding_count": 3,
                                      "lost_bytes": 12, "lost_count": 2}
    lost = suppressions.FailOnLeak("lost", 11)
    assert suppressions.leaked(report, lost)
    assert not suppressions.leaked(report, lost._replace(threshold=12))
    # The census's lost blocks (no stack to suppress them by) count too; and with no
    # suppression in force (--no-suppressions: nothing applied), lost bytes still count.
    report["leak_check"]["before_attach"] = {"definitely_lost_bytes": 5,
                                             "definitely_lost_count": 1,
                                             "indirectly_lost_bytes": 0,
                                             "indirectly_lost_count": 0}
    suppressions.apply(report, sups)
    assert report["unsuppressed"]["lost_bytes"] == 17
    del report["unsuppressed"]
    assert suppressions.leaked(report, lost._replace(threshold=16))
    assert suppressions._without_parameters("ns::f<int(char)>(int, char*)") == "ns::f<int(char)>"
    assert suppressions._without_parameters("operator()(int)") == "operator()"


def frame(function, module):
    return {"function": function, "module": module, "file": None}


def test_defaults_leave_out_what_the_runtime_keeps_by_design():
    """A runtime library's constructor (every frame before _dl_init the runtime's), the loader's
    own allocations and stdio's buffers; a user library's constructor, or a leak through
    libstdc++ from the program's code, is still a leak."""
    runtime_ctor = [frame(None, "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"),
                    frame("call_init", "/lib64/ld-linux-x86-64.so.2"),
                    frame("_dl_init", "/lib64/ld-linux-x86-64.so.2")]
    user_ctor = [frame("lib_init", "/opt/app/libapp.so")] + runtime_ctor[1:]
    loader = [frame("_dl_allocate_tls", "/lib64/ld-linux-x86-64.so.2"),
              frame("pthread_create", "/lib/x86_64-linux-gnu/libc.so.6")]
    stdio = [frame("_IO_file_doallocate", "/lib/x86_64-linux-gnu/libc.so.6"),
             frame("main", "/opt/app/app")]
    through_string = [frame("operator new(unsigned long)", "/usr/lib/libstdc++.so.6"),
                      frame("remember_session", "/opt/app/app")]

    def which(stack):
        hit = next((s for s in suppressions.defaults() if s.matches(stack)), None)
        return hit and hit.pattern

    assert which(runtime_ctor) == "<a runtime library's constructor>"
    assert which(loader) == "<the loader's own>"
    assert which(stdio) == "_IO_file_doallocate"
    assert which(user_ctor) is None and which(through_string) is None
    assert all(s.source == suppressions.DEFAULTS_SOURCE for s in suppressions.defaults())
    assert suppressions.load([]) == [] and len(suppressions.load([], True)) == 3
