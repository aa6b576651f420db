"""Known leaks, in LeakSanitizer's suppression format (issue 34): `leak:PATTERN` lines, `#`
comments. A pattern matches a stack when it matches any frame's function, source file or module,
as LSan matches it: anywhere in the name, `*` for any run of characters, `^` and `$` to anchor
it. heaptrack's and LSan's files are read unchanged (their lines of other kinds, which other
sanitizers read, are left alone). A stack matched by a suppression is not a leak for
--fail-on-leak; the report says which suppressions matched how many blocks and bytes ("Suppressions
used", as LSan prints it), and --print-suppressions writes one line per leaking stack."""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import NamedTuple

EXIT_LEAKS = 23  # LeakSanitizer's exit code, which CI jobs already test for


class FailOnLeak(NamedTuple):
    """--fail-on-leak: what counts ("lost": definitely and indirectly lost, as LeakSanitizer
    counts leaks; "outstanding": every byte still allocated) and above how many bytes."""
    counts: str
    threshold: int


class SuppressionError(ValueError):
    """A file that cannot be read as suppressions, in one line."""


@dataclass
class Suppression:
    pattern: str
    source: str  # FILE:LINE, or the program's embedded list
    blocks: int = 0
    bytes: int = 0

    def __post_init__(self):
        body = self.pattern
        start = body.startswith("^")
        end = body.endswith("$") and len(body) > start
        body = body[1 if start else 0:len(body) - 1 if end else len(body)]
        self._re = re.compile(("^" if start else "") + ".*".join(map(re.escape, body.split("*")))
                              + ("$" if end else ""))
        self.forget()

    def matches(self, frames: list) -> bool:
        self.judge(frames)
        return self.judged_match(frames)

    def judged_match(self, frames: list) -> bool:
        """matches(), for frames judge() was given."""
        return not self._hit.isdisjoint(map(id, frames))

    def judge(self, frames) -> None:
        self.judge_named(by_names(frames))

    def judge_named(self, named: dict) -> None:
        """Each frame dict judged once (`_hit`: the ids of those this suppression matches),
        by its names: `named` is by_names() of frames. Reports share one dict per return
        address among all the stacks through it (symbolize.stack_frames), and a function's
        many return addresses share its names: apply() groups a report's distinct frames by
        name once for every suppression, each judges a name once, and a stack is then one set
        operation, not a Python loop per frame."""
        hit, kept = self._hit, self._kept
        for names, dicts in named.items():
            if self._names_hit(*names):
                hit.update(map(id, dicts))
        kept.append(named)  # (the dicts: an id stays its own while it is known)

    def _names_hit(self, function: str | None, file: str | None, module: str | None) -> bool:
        return self._name_hit(function) or self._name_hit(file) or self._name_hit(module)

    def _name_hit(self, name: str | None) -> bool:
        """The pattern searched once per name: a function's many return addresses are as many
        frame dicts, and the names they share are few."""
        if not name:
            return False
        known = self._names.get(name)
        if known is None:
            known = self._names[name] = self._re.search(name) is not None
        return known

    def forget(self) -> None:
        """Drop the verdicts by frame (and the frames they keep alive) after a report."""
        self._kept: list = []
        self._hit: set[int] = set()
        self._names: dict[str, bool] = {}


def by_names(frames) -> dict:
    """Distinct frame dicts by the names a suppression reads: {(function, file, module):
    [dicts]}."""
    out: dict = {}
    for f in frames:
        names = (f.get("function"), f.get("file"), f.get("module"))
        got = out.get(names)
        if got is None:
            out[names] = [f]
        else:
            got.append(f)
    return out


RUNTIME = re.compile(r"^(libc[.-]|libc\.musl|ld-linux|ld-musl|libstdc\+\+|libc\+\+|libgcc_s|"
                     r"libm[.-]|libpthread|libdl[.-])")
LOADER = re.compile(r"^(ld-linux|ld-musl)")
DEFAULTS_SOURCE = "memhook's defaults"
LOADERS_OWN = "<the loader's own>"


class RuntimeOwn(Suppression):
    """What the runtime allocates once and keeps for the life of the process by design, as
    LeakSanitizer's built-in suppressions and valgrind's "still reachable" leave out of a leak
    check: blocks a runtime library's constructor allocated (libstdc++'s emergency exception
    pool: every frame before the loader's _dl_init is the runtime's), and the loader's own
    (thread-local storage, dlopen's link maps: the allocating frame is the loader's)."""

    def judge_named(self, named: dict) -> None:
        if self.pattern != LOADERS_OWN:  # (its verdict is the first frame's module)
            super().judge_named(named)

    def judged_match(self, frames: list) -> bool:
        if self.pattern == LOADERS_OWN:
            return bool(frames) and self._module_is(frames[0], LOADER)
        if self._hit.isdisjoint(map(id, frames)):  # (no _dl_init: most stacks)
            return False
        init = next(i for i, f in enumerate(frames) if id(f) in self._hit)
        return bool(init) and all(self._module_is(f, RUNTIME) for f in frames[:init])

    def _names_hit(self, function, file, module) -> bool:  # (the constructor's kind: the
        return function in ("_dl_init", "call_init")  # loader calling it)

    def _module_is(self, frame: dict, kind: re.Pattern) -> bool:
        name = frame.get("module") or ""
        known = self._modules.get(name)
        if known is None:
            known = self._modules[name] = kind.match(os.path.basename(name)) is not None
        return known

    def forget(self) -> None:
        super().forget()
        self._modules: dict[str, bool] = {}


def defaults() -> list[Suppression]:
    """memhook's own suppressions, after the user's (listed as used like theirs; turned off
    by --no-default-suppressions): glibc's stdio buffers, and RuntimeOwn's two kinds."""
    return [Suppression("_IO_file_doallocate", DEFAULTS_SOURCE),
            RuntimeOwn("<a runtime library's constructor>", DEFAULTS_SOURCE),
            RuntimeOwn(LOADERS_OWN, DEFAULTS_SOURCE)]


EMBEDDED_SOURCE = "the program's __lsan_default_suppressions()"


def parse(text: str, source: str, strict: bool = True) -> list[Suppression]:
    """`strict`: a line that is not KIND:PATTERN is a SuppressionError (a user's file); else it
    is left out (the program's own list: not the user's to mend)."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, sep, pattern = line.partition(":")
        if (not sep or not kind or " " in kind) and not strict:
            continue
        if not sep or not kind or " " in kind:
            raise SuppressionError(f"{source}:{n}: not a suppression (KIND:PATTERN, such as "
                                   f"leak:my_function): {line[:80]!r}")
        if kind.strip() == "leak" and pattern.strip():
            out.append(Suppression(pattern.strip(), f"{source}:{n}" if strict else source))
    return out


def load(paths: list[str], with_defaults: bool = False, embedded: str = ""
         ) -> list[Suppression]:
    """The suppressions of every file in `paths`, then those the program embeds (its
    __lsan_default_suppressions(), read at attach: capture metadata "embedded_suppressions"),
    then memhook's defaults if asked for."""
    out = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                out += parse(f.read(), path)
        except OSError as e:
            raise SuppressionError(f"cannot read suppressions {path}: {e.strerror}") from None
    out += parse(embedded, EMBEDDED_SOURCE, strict=False)
    return out + (defaults() if with_defaults else [])


def apply(report: dict, suppressions: list[Suppression]) -> dict:
    """Mark the report's leaking stacks that a suppression matches (the first, in file order),
    count what each matched, and add "suppressions" (those used) and "unsuppressed" (what is
    left outstanding) to the report. Returns the report."""
    stacks = [site["frames"] for site in report["sites"] if site["outstanding_bytes"] > 0] + \
        [r["frames"] for r in report.get("leak_suspects", [])]
    named = by_names({id(f): f for frames in stacks for f in frames}.values())
    for s in suppressions:
        s.blocks = s.bytes = 0
        s.judge_named(named)
    left_bytes = left_blocks = lost_bytes = lost_blocks = 0
    for site in report["sites"]:
        if site["outstanding_bytes"] <= 0:
            continue
        hit = next((s for s in suppressions if s.judged_match(site["frames"])), None)
        if hit is None:
            left_bytes += site["outstanding_bytes"]
            left_blocks += site["outstanding_count"]
            lost_bytes += site.get("definitely_lost_bytes", 0) + site.get("indirectly_lost_bytes", 0)
            lost_blocks += site.get("definitely_lost_count", 0) + site.get("indirectly_lost_count", 0)
            continue
        site["suppressed_by"] = hit.pattern
        hit.blocks += site["outstanding_count"]
        hit.bytes += site["outstanding_bytes"]
    for r in report.get("leak_suspects", []):
        hit = next((s for s in suppressions if s.judged_match(r["frames"])), None)
        if hit is not None:
            r["suppressed_by"] = hit.pattern
    for s in suppressions:
        s.forget()
    if suppressions:
        report["suppressions"] = [{"pattern": s.pattern, "source": s.source, "blocks": s.blocks,
                                   "bytes": s.bytes} for s in suppressions if s.blocks]
    report["unsuppressed"] = {"outstanding_bytes": left_bytes, "outstanding_count": left_blocks}
    if checked(report):  # (and the census's lost blocks: no stack to suppress them by)
        before = report["leak_check"].get("before_attach") or {}
        report["unsuppressed"].update(
            lost_bytes=lost_bytes + before.get("definitely_lost_bytes", 0)
            + before.get("indirectly_lost_bytes", 0),
            lost_count=lost_blocks + before.get("definitely_lost_count", 0)
            + before.get("indirectly_lost_count", 0))
    return report


def checked(report: dict) -> bool:
    """The report has the leak check's categories (it was taken, not skipped)."""
    return bool((report.get("leak_check") or {}).get("totals"))


def suggested(report: dict) -> str:
    """One suppression per leaking stack not already suppressed, named by its first frame with a
    function (without its parameters), for a person to edit; the stack in a comment above."""
    lines = ["# memhook report --print-suppressions: one per leaking stack; edit before use"]
    seen = set()
    lost_only = checked(report)  # (with the leak check, a leak is a lost block, as for LSan)
    for site in report["sites"]:
        if site["outstanding_bytes"] <= 0 or site.get("suppressed_by"):
            continue
        if lost_only and not site.get("definitely_lost_count", 0) + \
                site.get("indirectly_lost_count", 0):
            continue
        names = [f["function"] for f in site["frames"] if f.get("function")]
        if not names:
            continue
        name = _without_parameters(names[0])
        if name in seen:
            continue
        seen.add(name)
        lines.append(f"# {site['outstanding_count']} blocks, {site['outstanding_bytes']} bytes: "
                     + " <- ".join(_without_parameters(n) for n in names[:4]))
        lines.append(f"leak:{name}")
    return "\n".join(lines)


def _without_parameters(name: str) -> str:
    """`grow_heap()` -> `grow_heap`, `ns::f(int, char*)` -> `ns::f`: a pattern that still
    matches the function however its parameters are spelled (operators keep their own)."""
    depth = 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i and not name[:i].endswith("operator"):
            return name[:i]
    return name


def embedded_in(cap) -> str:
    """The suppressions every process of a capture embedded, one list."""
    return "\n".join(dict.fromkeys(c.meta.get("embedded_suppressions") or ""
                                    for c in (cap.processes or [cap])))


def in_force(a) -> bool:
    """Suppressions apply wherever leaks or suspects are listed, as heaptrack_print and LSan
    apply theirs (the program's own, memhook's defaults, --suppressions files), unless
    --no-suppressions."""
    return not getattr(a, "no_suppressions", False)


def check_arguments(a) -> None:
    """The suppression options as given: every file readable and well formed, and not
    --no-suppressions beside --suppressions. ValueError says which."""
    load(a.suppressions)
    if a.no_suppressions and a.suppressions:
        raise ValueError("--no-suppressions applies none: drop --suppressions")


def apply_to_report(report: dict, cap, a) -> list | None:
    """The suppressions in force on a report built from `cap`: sites marked, the suspects
    they match left out and counted apart. Returns them (None under --no-suppressions)."""
    if not in_force(a):
        return None
    known = load(a.suppressions, a.default_suppressions, embedded_in(cap))
    apply(report, known)
    asked = bool(a.suppressions) or a.fail_on_leak is not None or \
        bool(getattr(a, "print_suppressions", False))
    if not asked and not report.get("suppressions"):
        report.pop("unsuppressed", None)  # (nothing matched, nothing weighed: nothing to say)
        report.pop("suppressions", None)
    out = [r for r in report.get("leak_suspects", []) if r.get("suppressed_by")]
    if out:
        report["leak_suspects"] = [r for r in report["leak_suspects"]
                                   if not r.get("suppressed_by")]
        report["suppressed_suspects"] = {"count": len(out),
                                         "outstanding_bytes": sum(r["outstanding_bytes"]
                                                                  for r in out)}
    return known


def leaked(report: dict, fail: FailOnLeak) -> bool:
    """--fail-on-leak: more than its threshold lost (or outstanding) and not suppressed. A
    report without the leak check (skipped, or turned off) counts outstanding bytes, and says
    so on stderr."""
    left = report.get("unsuppressed") or apply(dict(report), [])["unsuppressed"]
    if fail.counts == "lost" and checked(report):
        return left.get("lost_bytes", 0) > fail.threshold
    if fail.counts == "lost":
        why = (report.get("leak_check") or {}).get("skipped", "no leak check was taken")
        print(f"memhook: --fail-on-leak counts outstanding bytes: no leak check ({why})",
              file=sys.stderr, flush=True)
    return left.get("outstanding_bytes", report["totals"]["outstanding_bytes"]) > fail.threshold
