"""A real program under its own workload, with and without memhook (issue 4, benchmark 4).

SQLite's shell (Debian's sqlite3, which allocates through the system malloc) runs a database
workload: 60,000 rows of random keys and blobs inserted, indexed, grouped, joined, updated and
dropped again. The same sqlite3 process runs it CYCLES times unprofiled and CYCLES times with
memhook attached, alternating; throughput is workloads per second, and the ratio is attached over
unprofiled (medians).

    sudo .venv/bin/python benchmarks/real_program.py [--cycles 5] [-- memhook args]
"""
import argparse
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter

from driver import alternate, report_of

WORKLOAD = """
CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, k TEXT, v BLOB, n INT);
DELETE FROM t;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 60000)
  INSERT INTO t(k, v, n) SELECT hex(randomblob(12)), randomblob(50 + abs(random()) % 300),
                                abs(random()) % 1000 FROM c;
CREATE INDEX IF NOT EXISTS t_k ON t(k);
SELECT n, count(*), sum(length(v)) FROM t GROUP BY n ORDER BY 2 DESC LIMIT 3;
SELECT count(*) FROM (SELECT k, group_concat(n) FROM t GROUP BY substr(k, 1, 3));
UPDATE t SET v = randomblob(40 + n % 200) WHERE n % 3 = 0;
SELECT count(DISTINCT substr(k, 1, 4)) FROM t;
SELECT sum(length(a.k || b.k)) FROM t a JOIN t b ON a.id = b.id + 1 WHERE a.n < 500;
DROP INDEX t_k;
SELECT 'workload-done';
"""


class Sqlite:
    def __init__(self, exe: str):
        # stdbuf: the shell's answers must not wait in a pipe buffer.
        self.p = subprocess.Popen(["stdbuf", "-oL", exe, ":memory:"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)

    def run(self) -> float:
        """Seconds for one workload."""
        t0 = time.perf_counter()
        self.p.stdin.write(WORKLOAD)
        self.p.stdin.flush()
        for line in self.p.stdout:
            if line.strip() == "workload-done":
                return time.perf_counter() - t0
        raise RuntimeError("sqlite3 ended")

    def close(self) -> int:
        self.p.stdin.close()
        return self.p.wait(10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="workloads per measurement")
    ap.add_argument("memhook_args", nargs="*", help="extra memhook options (after --)")
    a = ap.parse_args()
    exe = shutil.which("sqlite3")
    if not exe:
        sys.exit("sqlite3 is not installed (apt-get install sqlite3)")
    db = Sqlite(exe)
    db.run()  # warm up: the heap reaches its working size
    bare, hooked, dropped, outputs = alternate(
        db.p.pid, a.cycles, a.memhook_args, ["sqlite3"],
        lambda _: a.runs / sum(db.run() for _ in range(a.runs)))
    # The final report's totals come before its sites.
    events = sum(report_of(out)["totals"][k] for out in outputs
                 for k in ("alloc_count", "free_count"))
    assert db.close() == 0
    b, h = statistics.median(bare["sqlite3"]), statistics.median(hooked["sqlite3"])
    print(f"sqlite3 workload: unprofiled {b:.2f}/s, memhook {h:.2f}/s, ratio {h / b:.2f}")
    print(f"events traced (all cycles): {events}, dropped: {dropped['events']} "
          f"({dropped['frees']} frees)")
    print_stacks(outputs[-1])


def print_stacks(output: str) -> None:
    """How whole the last session's stacks are: frames per site, weighted by allocations, and
    how many sites end at main, at a marker ([no unwind info], [unwind stopped]) or elsewhere
    (the depth limit)."""
    report = report_of(output)
    depths, ends = [], Counter()
    for s in report["sites"]:
        names = [f.get("function") or "" for f in s["frames"] if not f.get("inlined")]
        depths += [len(names)] * s["alloc_count"]
        last = names[-1] if names else ""
        ends["main" if last == "main" else last if last.startswith("[") else "other"] += 1
    depths.sort()
    print(f"frames per allocation: median {depths[len(depths) // 2]}, "
          f"10th percentile {depths[len(depths) // 10]}, max {depths[-1]}; "
          f"sites ending: {dict(ends)}")


if __name__ == "__main__":
    main()
