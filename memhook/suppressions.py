"""Known leaks, in LeakSanitizer's suppression format (issue 34): `leak:PATTERN` lines, `#`
comments. A pattern matches a stack when it matches any frame's function, source file or module,
as LSan matches it: anywhere in the name, `*` for any run of characters, `^` and `$` to anchor
it. heaptrack's and LSan's files are read unchanged (their lines of other kinds, which other
sanitizers read, are left alone). A stack matched by a suppression is not a leak for
--fail-on-leak; the report says which suppressions matched how many blocks and bytes ("Suppressions
used", as LSan prints it), and --print-suppressions writes one line per leaking stack."""
from __future__ import annotations

import re
from dataclasses import dataclass

EXIT_LEAKS = 23  # LeakSanitizer's exit code, which CI jobs already test for


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

    def matches(self, frames: list) -> bool:
        return any(self._re.search(name) for f in frames
                   for name in (f.get("function"), f.get("file"), f.get("module")) if name)


def parse(text: str, source: str) -> list[Suppression]:
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, sep, pattern = line.partition(":")
        if not sep or not kind or " " in kind:
            raise SuppressionError(f"{source}:{n}: not a suppression (KIND:PATTERN, such as "
                                   f"leak:my_function): {line[:80]!r}")
        if kind.strip() == "leak" and pattern.strip():
            out.append(Suppression(pattern.strip(), f"{source}:{n}"))
    return out


def load(paths: list[str]) -> list[Suppression]:
    out = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                out += parse(f.read(), path)
        except OSError as e:
            raise SuppressionError(f"cannot read suppressions {path}: {e.strerror}") from None
    return out


def apply(report: dict, suppressions: list[Suppression]) -> dict:
    """Mark the report's leaking stacks that a suppression matches (the first, in file order),
    count what each matched, and add "suppressions" (those used) and "unsuppressed" (what is
    left outstanding) to the report. Returns the report."""
    for s in suppressions:
        s.blocks = s.bytes = 0
    left_bytes = left_blocks = 0
    for site in report["sites"]:
        if site["outstanding_bytes"] <= 0:
            continue
        hit = next((s for s in suppressions if s.matches(site["frames"])), None)
        if hit is None:
            left_bytes += site["outstanding_bytes"]
            left_blocks += site["outstanding_count"]
            continue
        site["suppressed_by"] = hit.pattern
        hit.blocks += site["outstanding_count"]
        hit.bytes += site["outstanding_bytes"]
    if suppressions:
        report["suppressions"] = [{"pattern": s.pattern, "source": s.source, "blocks": s.blocks,
                                   "bytes": s.bytes} for s in suppressions if s.blocks]
    report["unsuppressed"] = {"outstanding_bytes": left_bytes, "outstanding_count": left_blocks}
    return report


def suggested(report: dict) -> str:
    """One suppression per leaking stack not already suppressed, named by its first frame with a
    function (without its parameters), for a person to edit; the stack in a comment above."""
    lines = ["# memhook report --print-suppressions: one per leaking stack; edit before use"]
    seen = set()
    for site in report["sites"]:
        if site["outstanding_bytes"] <= 0 or site.get("suppressed_by"):
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


def leaked(report: dict, threshold: int) -> bool:
    """--fail-on-leak: more than `threshold` bytes outstanding and not suppressed."""
    return report.get("unsuppressed", {"outstanding_bytes": report["totals"]["outstanding_bytes"]}
                      )["outstanding_bytes"] > threshold
