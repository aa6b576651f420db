"""Compare the machine code of two builds of the hook library, function by function.

    python benchmarks/machine_code.py OLD.so NEW.so [--show NAME] [--rename OLD=NEW ...]

Each function is disassembled with objdump and normalized: addresses become the symbol they
point into (jump targets, calls and RIP-relative data alike), so a function reads the same
wherever the linker placed it. Prints which functions are identical, which differ, and which
exist in one build only. Needs unstripped libraries: build/<wheel tag>/libmemhook_hook.so.
The entry points the hot path runs are named at the end (HOT); a change that must keep the
hot path as it was expects every one of them identical.
"""
from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys

HOT = re.compile(r"^(memhook_hook_|memhook_sample_|memhook_filter_|memhook_record_malloc|"
                 r"memhook_compare_|framed_|general_|fast_|slow_|record_|reserve_slow|claim_ring)")
FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
ADDR_SYM = re.compile(r"\b[0-9a-f]+ <([^>]+)>")
COMMENT = re.compile(r"#\s*[0-9a-f]+ <([^>]+)>")
PADDING = re.compile(r"^(nop|xchg +%ax,%ax|data16|cs nop|int3)")
ISRA = re.compile(r"\.(isra|constprop|part|cold)\.\d+")


def functions(path: str, renames=()) -> dict[str, list[str]]:
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", "-w", path], check=True,
                         capture_output=True, text=True).stdout
    out = out.replace("(anonymous namespace)::", "").replace("memhook::", "")
    for old, new in renames:
        out = out.replace(old, new)
    funcs: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            current = ISRA.sub(r".\1", m.group(1))
            funcs[current] = []
            continue
        if current is None or not line.strip() or "\t" not in line:
            continue
        insn = line.split("\t", 1)[1].strip()
        insn = COMMENT.sub(r"# <\1>", insn)
        insn = ADDR_SYM.sub(r"<\1>", insn)
        # RIP-relative displacements move with layout; the comment names the target.
        insn = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "(%rip)", insn)
        # A GOT entry or constant pool: named by the nearest symbol, at an offset that moves.
        insn = re.sub(r"(@@Base|_GLOBAL_OFFSET_TABLE_|_fini)[+-]0x[0-9a-f]+", r"\1", insn)
        funcs[current].append(ISRA.sub(r".\1", insn))
    for name, insns in funcs.items():
        if name.endswith("@plt"):  # the linker's: only its jump through the GOT is ours
            insns[:] = insns[:1]
    for insns in funcs.values():  # padding after the last instruction
        while insns and PADDING.match(insns[-1]):
            insns.pop()
    return funcs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--show", help="print the diff of this function")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                    help="a name the new build spells differently (repeatable)")
    a = ap.parse_args()
    old = functions(a.old, [tuple(r.split("=", 1)) for r in a.rename])
    new = functions(a.new)
    same = [f for f in old if f in new and old[f] == new[f]]
    differ = [f for f in old if f in new and old[f] != new[f]]
    gone = [f for f in old if f not in new]
    added = [f for f in new if f not in old]
    hot_old = [f for f in old if HOT.match(f)]
    print(f"{len(same)} identical, {len(differ)} differ, {len(gone)} only in old, "
          f"{len(added)} only in new")
    for title, names in (("differ", differ), ("only in old", gone), ("only in new", added)):
        for f in names:
            print(f"  {title}: {f}" + ("  [hot]" if HOT.match(f) else ""))
    hot_same = [f for f in hot_old if f in same]
    print(f"hot path: {len(hot_same)} of {len(hot_old)} functions identical")
    if a.show:
        sys.stdout.writelines(difflib.unified_diff([i + "\n" for i in old.get(a.show, [])],
                                                   [i + "\n" for i in new.get(a.show, [])],
                                                   "old", "new"))
    return 0 if len(hot_same) == len(hot_old) else 1


if __name__ == "__main__":
    sys.exit(main())
