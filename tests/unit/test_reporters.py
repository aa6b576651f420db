"""Every report format from one capture made here (synthetic.py: a real program's return
addresses), checked against what the capture holds and what binutils says of the addresses:
the JSON model, text, folded stacks, pprof (decoded field by field), OTLP (parsed with
opentelemetry-proto), the HTML page, and the one registry they are rendered through."""
from __future__ import annotations

import gzip
import json
import re
import subprocess

import pytest

import synthetic
from memhook import reporters
from memhook.reporters import model
from memhook.symbolize import Symbolizer

RAW_ADDRESS = re.compile(r"0x[0-9a-f]{6,}")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    return synthetic.compile_program(tmp_path_factory.mktemp("program"))


@pytest.fixture(scope="module")
def cap(program):
    framed = synthetic.return_addresses(program, "framed")[0]
    frameless = synthetic.return_addresses(program, "frameless")[0]
    main_framed, main_frameless = synthetic.return_addresses(program, "main")[:2]
    return synthetic.make(program, [
        synthetic.Stack([framed, main_framed], 10, 3000, history=[600, 1200, 1800, 2400, 3000]),
        synthetic.Stack([frameless, main_frameless], 7, 700, history=[700] * 5),
        synthetic.Stack([main_framed], 1000, 16000, 1000, 16000, history=[160, 0, 320, 0, 0]),
    ])


@pytest.fixture(scope="module")
def rep(cap):
    return model.build(cap, Symbolizer(cap.modules, tool="pyelftools"))


def addr2line(program, address: int) -> tuple[str, str, int]:
    """binutils' answer for a return address (the call before it): function, file, line."""
    out = subprocess.run(["addr2line", "-f", "-e", str(program), hex(address - 1)],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    file, line = out[1].rsplit(":", 1)
    return out[0], file, int(line.split()[0])


def test_model_sites_frames_and_totals(cap, rep, program):
    assert [s["outstanding_bytes"] for s in rep["sites"]] == [3000, 700, 0]
    assert rep["totals"]["outstanding_bytes"] == 3700 and rep["totals"]["alloc_count"] == 1017
    assert rep["pid"] == 4242 and rep["sites"][0]["operations"] == ["malloc"]
    for site, stack in zip(rep["sites"], (1, 2, 3)):
        for f, addr in zip(site["frames"], cap.frames(stack)):
            function, file, line = addr2line(program, int(addr) - synthetic.BIAS)
            assert (f["function"], f["line"]) == (function, line), (f, function, line)
            assert f["file"].endswith(file.rsplit("/", 1)[-1])
            assert f["module"] == str(program) and f["offset"] == int(addr) - synthetic.BIAS
    assert [f["function"] for f in rep["sites"][0]["frames"]] == ["framed", "main"]
    assert [r["outstanding_bytes"] for r in rep["leak_suspects"]][:1] == [3000]


def test_text(rep):
    text = reporters.render("text", None, rep, None, top=2)
    assert "outstanding 1017 blocks" not in text  # (outstanding is 17)
    assert "outstanding 17 blocks, 3700 bytes (3.6 KiB)" in text
    assert "#1 3000 bytes in 10 blocks (10 allocated, 0 freed) [malloc]" in text
    assert re.search(r"^\s+framed  \S*unwind_framed\.c:\d+$", text, re.M), text
    assert "#3" not in text  # --top 2
    assert not RAW_ADDRESS.search(text)


def test_text_from_the_stacks_still_holding_bytes_alone(cap, rep):
    """The text report is built from the stacks that still hold bytes (model.Filters
    outstanding_only: memhook report's and memhook run's text), and reads as the one built from
    every stack, without the stack that freed all it allocated."""
    held = model.build(cap, Symbolizer(cap.modules, tool="pyelftools"),
                       model.Filters(outstanding_only=True))
    assert [s["outstanding_bytes"] for s in held["sites"]] == [3000, 700]
    assert held["sites"] == rep["sites"][:2]
    for top in (1, 10):
        assert reporters.render("text", None, held, None, top=top) == \
            reporters.render("text", None, rep, None, top=top)


def test_collapsed(rep):
    assert reporters.render("collapsed", None, rep, None).splitlines() == [
        "main;framed 3000", "main;frameless 700"]
    assert reporters.render("collapsed", None, rep, None, weight="count").splitlines()[0] == \
        "main 1000"


def test_json_is_the_model(cap, rep):
    assert json.loads(reporters.render("json", cap, rep, None)) == rep


def protobuf(buf: bytes) -> dict:
    """A protobuf message's fields: number -> [values] (varints as ints, the rest as bytes)."""
    fields: dict = {}
    i = 0

    def varint():
        nonlocal i
        n = shift = 0
        while True:
            b = buf[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return n

    while i < len(buf):
        key = varint()
        if key & 7 == 0:
            value = varint()
        elif key & 7 == 2:
            size = varint()
            value, i = buf[i:i + size], i + size
        else:
            raise AssertionError(f"wire type {key & 7}")
        fields.setdefault(key >> 3, []).append(value)
    return fields


def _packed(b: bytes) -> list:
    out, n, shift = [], 0, 0
    for x in b:
        n |= (x & 0x7F) << shift
        shift += 7
        if x < 0x80:
            out.append(n)
            n = shift = 0
    return out


def test_pprof(cap, rep):
    """Go's heap profile: four sample types in Go's order and the peak's, a sample per site
    holding bytes, each location's line naming its function."""
    prof = protobuf(gzip.decompress(reporters.render("pprof", cap, rep, Symbolizer(cap.modules))))
    strings = [s.decode() for s in prof[6]]
    types = [(strings[protobuf(t)[1][0]], strings[protobuf(t)[2][0]]) for t in prof[1]]
    assert types == [("alloc_objects", "count"), ("alloc_space", "bytes"),
                     ("inuse_objects", "count"), ("inuse_space", "bytes"),
                     ("peak_space", "bytes")]
    functions = {protobuf(f)[1][0]: strings[protobuf(f)[2][0]] for f in prof[5]}
    locations = {}
    for loc in prof[4]:
        fields = protobuf(loc)
        locations[fields[1][0]] = [functions[protobuf(line)[1][0]] for line in fields[4]]
    samples, leak_frames = {}, {}
    for s in prof[2]:
        fields = protobuf(s)
        stack = tuple(name for lid in _packed(fields[1][0]) for name in locations[lid])
        samples[stack] = _packed(fields[2][0])
        (label,) = [protobuf(x) for x in fields[3]]  # the frame to fix, a label to group by
        assert strings[label[1][0]] == "memhook.leak_frame"
        leak_frames[stack] = strings[label[2][0]]
    assert leak_frames[("framed", "main")].startswith("framed  ")
    assert re.fullmatch(r"framed  \S+unwind_framed\.c:\d+", leak_frames[("framed", "main")])
    assert samples[("framed", "main")] == [10, 3000, 10, 3000, 0]  # (no peak in this capture)
    assert samples[("frameless", "main")] == [7, 700, 7, 700, 0]
    assert samples[("main",)] == [1000, 16000, 0, 0, 0]


def test_otlp(cap, rep):
    """An export request with one resource (the process), one profile per sample type
    (in-use space first), samples whose stacks name the functions."""
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceRequest)
    req = ExportProfilesServiceRequest()
    req.ParseFromString(reporters.render("otlp", cap, rep, Symbolizer(cap.modules),
                                         labels={"service": "shop"}))
    d = req.dictionary
    (resource,) = req.resource_profiles
    attrs = {a.key: a.value for a in resource.resource.attributes}
    assert attrs["process.pid"].int_value == 4242 and attrs["service.name"].string_value == "shop"
    profiles = resource.scope_profiles[0].profiles
    names = [d.string_table[p.sample_type.type_strindex] for p in profiles]
    assert names == ["inuse_space", "inuse_objects", "alloc_space", "alloc_objects"]

    def stack_names(index):
        out = []
        for li in d.stack_table[index].location_indices:
            for line in d.location_table[li].lines:
                out.append(d.string_table[d.function_table[line.function_index].name_strindex])
        return tuple(out)

    inuse = {stack_names(s.stack_index): list(s.values) for s in profiles[0].samples}
    for sample in profiles[0].samples:  # each sample: the frame to fix, as an attribute
        (a,) = [d.attribute_table[i] for i in sample.attribute_indices]
        assert d.string_table[a.key_strindex] == "memhook.leak_frame" if hasattr(
            a, "key_strindex") else a.key == "memhook.leak_frame"
        assert a.value.string_value.startswith(stack_names(sample.stack_index)[0] + "  ")
    assert inuse == {("framed", "main"): [3000], ("frameless", "main"): [700]}
    allocs = {stack_names(s.stack_index): list(s.values) for s in profiles[3].samples}
    assert allocs[("main",)] == [1000]


def test_html(cap, rep):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no figure drawn from nothing (a log axis of no data)
        # Not a figure's: a file another test left to the garbage collector, whose
        # ResourceWarning, made an error, was raised inside importlib's module lock while
        # matplotlib imported and broke the import (KeyError; CI of 709439d, once: an ELF file
        # of the symbolizer's, closed by it since; a descriptor's wrapper still reaches the
        # collector now and then in this tier).
        warnings.simplefilter("default", ResourceWarning)
        page = reporters.render("html", cap, rep, Symbolizer(cap.modules))
    assert page.startswith("<!DOCTYPE html>") or page.lstrip().startswith("<")
    for name in ("framed", "frameless", "main"):
        assert name in page
    assert not RAW_ADDRESS.search(re.sub(r"<svg.*?</svg>|data:image/[^\"']*", "", page,
                                         flags=re.S))


def test_html_flame_data_holds_each_frame_once(cap, rep):
    """The flame graph's data: each frame's names and kind once, every site with bytes a list of
    indices into them, root first, and its weights; decoded, the sites' own frames."""
    from memhook.common.format import frame_name
    page = reporters.render("html", cap, rep, Symbolizer(cap.modules))
    data = json.loads(re.search(r"<script id='flame-data' type='application/json'>(.*?)"
                                r"</script>", page, re.S).group(1))
    rows = [tuple(r) for r in data["frames"]]
    assert len(rows) == len(set(rows)) and {r[0] for r in rows} == {"framed", "frameless", "main"}
    sites = [s for s in rep["sites"] if s["alloc_count"] > 0]
    assert len(data["stacks"]) == len(sites)
    for (ids, outstanding, allocated, count), s in zip(data["stacks"], sites):
        assert [data["frames"][i][0] for i in ids] == [frame_name(f) for f in s["frames"]][::-1]
        assert (outstanding, allocated, count) == (s["outstanding_bytes"], s["alloc_bytes"],
                                                   s["alloc_count"])
    assert sum(len(ids) for ids, *_ in data["stacks"]) > len(rows)  # (main: in every stack)


def test_flame_rows_of_the_same_frames_are_one():
    """Stacks whose frames name the same functions (lines or call sites apart) are one row of
    the flame graph's data, their weights summed, in the order first seen."""
    from memhook.reporters.html import merged
    rows = [[[0, 1, 2], 10, 100, 1], [[0, 1], 5, 50, 2], [[0, 1, 2], 7, 70, 3], [[0], 0, 1, 1]]
    assert merged(rows) == [[[0, 1, 2], 17, 170, 4], [[0, 1], 5, 50, 2], [[0], 0, 1, 1]]
    assert merged([[[3, 4], 9], [[3, 4], 1]]) == [[[3, 4], 10]]  # (the peak's: one weight)


def test_every_format_is_registered():
    assert set(reporters.FORMATS) == {"text", "json", "collapsed", "pprof", "html", "otlp",
                                      "leaks"}
    with pytest.raises(KeyError):
        reporters.render("yaml", None, {}, None)


def _without_ids(svg: bytes) -> str:
    """A figure with matplotlib's per-drawing clip ids and date taken out."""
    s = svg.decode()
    s = re.sub(r"<dc:date>[^<]*</dc:date>", "", s)
    return re.sub(r'(?:id|clip-path|xlink:href)="[^"]*"|url\(#[^)]*\)', "", s)


def test_plots_drawn_beside_the_model(cap, rep):
    """The HTML report's figures, drawn in a child process while the model is built, are the
    figures drawn in this process; a child killed, or no child at all, still gives them."""
    import os
    from memhook.reporters import plots
    from memhook.reporters.plots_beside import Beside
    symbolizer = Symbolizer(cap.modules)
    here = {k: _without_ids(v) for k, v in plots.render(cap, rep, symbolizer, "svg").items()}
    beside = Beside(cap, symbolizer, "svg")
    child = beside.pid
    assert child and child != os.getpid()
    beside.ask(rep)
    got = beside.result()
    assert {k: _without_ids(v) for k, v in got.items()} == here and beside.by_child
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # reaped: no zombie left
    killed = Beside(cap, symbolizer, "svg")
    os.kill(killed.pid, 9)
    killed.ask(rep)
    assert {k: _without_ids(v) for k, v in killed.result().items()} == here
    # A child killed after it was asked (the HTML page is written in between).
    later = Beside(cap, symbolizer, "svg")
    later.ask(rep)
    os.kill(later.pid, 9)
    assert {k: _without_ids(v) for k, v in later.result().items()} == here
    assert later.pid == 0 and not later.by_child


def test_histograms_name_their_counts(cap, rep):
    """The histograms' log axes read as counts (1, 10, 100, 1k), a label a decade up to the
    tallest bar, without matplotlib's mathtext (10^3) or unlabelled minor ticks."""
    from memhook.reporters import plots
    sizes = [0] * 48
    sizes[4], sizes[7], sizes[11] = 25_000, 199_928, 1
    lifetimes = [0] * 48
    lifetimes[14], lifetimes[20] = 94_678, 1
    shaped = dict(rep, histograms={"size_log2": sizes, "lifetime_ns_log2": lifetimes,
                                   "lifetime_under_ns_log2": [0] * 48})
    svg = plots.render(cap, shaped, Symbolizer(cap.modules), "svg")["histograms"].decode()
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    counts = labels[labels.index("size (from)") + 1:labels.index("allocations (log scale)")]
    assert counts == ["1", "10", "100", "1k", "10k", "100k"], labels
    frees = labels[labels.index("lifetime (from)") + 1:labels.index("frees (log scale)")]
    assert frees == ["1", "10", "100", "1k", "10k", "100k"], labels
    assert "$" not in svg and svg.count('id="ytick_') == len(counts) + len(frees)


def test_an_html_report_imports_no_matplotlib_itself(cap, program, tmp_path):
    """`memhook report --format html`: matplotlib is imported by the child alone."""
    import sys
    path = tmp_path / "c.mh"
    from memhook import capture
    capture.write(str(path), cap)
    # (main given its arguments: the command line's own main ends the process at once)
    code = ("import sys; from memhook.cli import main\n"
            "main(['report', sys.argv[1], '--format', 'html', '-o', sys.argv[2]])\n"
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "c.html")],
                         capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr
    assert "<svg" in (tmp_path / "c.html").read_text()


def test_a_report_ended_at_once_keeps_its_output_and_exit_code(cap, tmp_path):
    """`memhook report` ends its process without Python's teardown (cli.end_report): what it
    printed reaches a pipe whole, --fail-on-leak's 23 is the exit code, and a reader that goes
    away early gets no traceback."""
    import sys
    path = tmp_path / "c.mh"
    from memhook import capture
    capture.write(str(path), cap)
    report = [sys.executable, "-m", "memhook", "report", str(path)]
    wide = subprocess.run([*report, "--format", "json"], capture_output=True, cwd="/")
    assert wide.returncode == 0 and wide.stderr == b"", wide.stderr
    assert len(json.loads(wide.stdout)["sites"]) == 3
    leaked = subprocess.run([*report, "--fail-on-leak=any-outstanding"], capture_output=True,
                            text=True, cwd="/")
    assert leaked.returncode == 23 and leaked.stdout.startswith("memhook report:"), leaked
    early = subprocess.run(" ".join(report) + " --format json | head -c1", shell=True,
                           capture_output=True, text=True, cwd="/")
    assert "Traceback" not in early.stderr and early.stdout == "{", early


def test_a_large_stack_left_out_of_the_suspects_is_named(program):
    """A request in flight as the capture ended holds most of the bytes: churn, no suspect;
    the text, the JSON and the HTML page name it and say why."""
    framed = synthetic.return_addresses(program, "framed")[0]
    main_framed = synthetic.return_addresses(program, "main")[0]
    flight = [60000 if i % 2 else 0 for i in range(9)] + [60000]
    cap = synthetic.make(program, [
        synthetic.Stack([framed, main_framed], 10, 3000, history=[300 * (i + 1) for i in range(10)]),
        synthetic.Stack([main_framed], 400, 400 * 60000, 399, 399 * 60000, history=flight)])
    rep = model.build(cap, Symbolizer(cap.modules, tool="pyelftools"))
    assert [r["outstanding_bytes"] for r in rep["not_suspects"]] == [60000]
    assert rep["not_suspects"][0]["frames"][0]["function"] == "main"
    text = reporters.render("text", cap, rep, Symbolizer(cap.modules))
    line = next(x for x in text.splitlines() if "not a suspect" in x)
    assert "holds 60000 bytes: main" in line and "churn: 399 of its 400 allocations freed" in line
    page = reporters.render("html", cap, rep, Symbolizer(cap.modules))
    assert "Not suspects, though each holds over a tenth" in page and "churn: 399" in page
