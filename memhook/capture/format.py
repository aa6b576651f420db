"""The capture file's format: a 24-byte header (magic, format version), then blocks appended
as the session goes, each
  kind (4 bytes) | crc32 of payload (u32) | payload length (u64) | zlib-compressed payload
so a capture cut off by a crash or kill -9 reads up to its last complete block. The blocks
and their columns: docs/capture-format.md (the one description; keep it in step with this
package). Capture is what every reader, writer and report holds in memory."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"MEMHOOK\0CAPTURE\0"
VERSION = 1
HEADER = struct.Struct("<16sII")
BLOCK = struct.Struct("<4sIQ")
MAX_BLOCK = 1 << 32
MAX_PROCESSES = 1 << 20
SITE_COLUMNS = ("alloc_count", "alloc_bytes", "free_count", "free_bytes", "outstanding_count",
                "outstanding_bytes", "op_mask")
# Since the dropped-free reconciliation (0 where a capture has none): outstanding blocks and
# bytes per stack that may have been freed unrecorded.
UNCERTAIN_COLUMNS = ("uncertain_count", "uncertain_bytes")
# Since the peak (absent in older captures): per stack, outstanding bytes at the session's peak.
PEAK_COLUMNS = ("peak_bytes",)
SERIES_COLUMNS = ("time_s", "outstanding_bytes", "outstanding_count", "alloc_count",
                  "free_count", "dropped_events")
MEMORY_COLUMNS = ("rss_bytes", "anon_bytes", "heap_bytes")  # of the process, per row
# Since the resident parts (0 where a capture has none): the process's resident memory by kind
# of part (resident.py's kinds, grouped), per row; they sum to rss_bytes as smaps read it.
PART_COLUMNS = ("rss_heap_bytes", "rss_anonymous_bytes", "rss_stack_bytes", "rss_file_bytes",
                "rss_shared_bytes", "rss_memhook_bytes", "rss_other_bytes")
LIVE_COLUMNS = ("ptr", "size", "stack", "tid", "ts")
BEHAVIOUR_ROWS = ("freed_same_thread", "freed_other_thread", "temporary", "freed_same_call")
BEHAVIOUR_HISTS = ("size_hist", "lifetime_hist", "age_hist")
# Since lifetimes carry their resolution (zeros where a capture has none): lifetimes known only
# to lie under a bound, by that bound's bucket.
BEHAVIOUR_LATER_HISTS = ("lifetime_unresolved_hist",)
BEHAVIOUR_PAIRS = ("pair_stack", "pair_alloc_tid", "pair_free_tid", "pair_count")
HIST_BUCKETS = 48  # each behaviour histogram's log2 buckets
# The histograms as BEHV blocks hold them since they are kept sparse (the consumer's
# sparse_histograms.h): NAME_at, each non-zero count's flat index (stack * HIST_BUCKETS +
# bucket), and NAME_count. Dense, a Python program's 349,000 stacks made 540 MB to compress at
# detach and to decompress in every report; in memory (Capture.behaviour) they are dense.
TOP_STACKS = 20  # stacks sampled in the time series per interval
TICK_CHUNKS = ("top_time_s", "top_stack", "top_bytes", "stk_time_s", "stk_id", "stk_bytes")
EVENT_DTYPE = np.dtype([("ts", "<u8"), ("ptr", "<u8"), ("size", "<u8"), ("stack", "<u4"),
                        ("tid", "<u4"), ("op", "u1"), ("is_free", "u1"), ("pad", "V6")])


class CaptureError(Exception):
    """A capture file that cannot be read, with a one-line reason."""


@dataclass
class Capture:
    meta: dict = field(default_factory=dict)
    modules: list = field(default_factory=list)
    sites: dict = field(default_factory=dict)      # SITE_COLUMNS -> array indexed by stack id
    stack_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.uint64))
    stack_frames: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    # SERIES_COLUMNS and MEMORY_COLUMNS per row; top_time_s/top_stack/top_bytes for the largest
    # stacks; stk_time_s/stk_id/stk_bytes whenever a stack's outstanding bytes changed
    series: dict = field(default_factory=dict)
    events: np.ndarray | None = None               # EVENT_DTYPE without pad, ts in ns since start
    complete: bool = False
    live: dict | None = None                       # LIVE_COLUMNS, ts in ns since start
    behaviour: dict | None = None                  # BEHAVIOUR_* arrays
    # A merged capture (merge()): the processes' own captures, and per process (rows, in that
    # order) and merged stack (columns) their outstanding bytes and blocks; stack_map: per
    # process, the merged id of each of its stacks.
    processes: list = field(default_factory=list)
    by_process: dict | None = None
    # SNAP blocks (snapshots.py), in order: number, time_s, reason, totals, rss_bytes, and
    # `sites` ({id, SITE_COLUMNS} of the stacks with any activity then)
    snapshots: list = field(default_factory=list)
    # PYCO blocks (python_code.py): Python code objects' records, by number
    python_code: dict = field(default_factory=dict)
    # PMAP blocks (perf_map.py): the JIT runtime's perf map, {"entries", "path", "cut"}
    jit_map: dict = field(default_factory=dict)

    @property
    def stack_count(self) -> int:
        return len(self.stack_offsets) - 1

    def frames(self, stack: int) -> np.ndarray:
        return self.stack_frames[int(self.stack_offsets[stack]):int(self.stack_offsets[stack + 1])]


def sparse_hists(b: dict) -> dict:
    """Behaviour with dense histograms (Capture.behaviour) as a BEHV block holds it."""
    out = {k: v for k, v in b.items() if k not in BEHAVIOUR_HISTS + BEHAVIOUR_LATER_HISTS}
    for k in BEHAVIOUR_HISTS + BEHAVIOUR_LATER_HISTS:
        if k in b:
            flat = np.ascontiguousarray(b[k], np.uint64).ravel()
            at = np.flatnonzero(flat)
            out[k + "_at"], out[k + "_count"] = at.astype(np.uint64), flat[at]
    return out


def dense_hists(b: dict) -> dict:
    """A BEHV block's behaviour (sparse histograms, or dense as older captures hold them) with
    dense histograms, one row per stack of its rows; ValueError if its indices do not fit."""
    rows = len(b["temporary"])
    hists = [k for k in BEHAVIOUR_HISTS + BEHAVIOUR_LATER_HISTS if k + "_at" in b]
    out = {k: v for k, v in b.items() if k not in {h + s for h in hists for s in ("_at", "_count")}}
    for k in hists:
        at, count = b[k + "_at"], b.get(k + "_count")
        if count is None or at.ndim != 1 or at.shape != count.shape or \
                (len(at) and int(at.max()) >= rows * HIST_BUCKETS):
            raise ValueError(f"{k}: counts out of its {rows} rows")
        dense = np.zeros(rows * HIST_BUCKETS, np.uint64)
        dense[at.astype(np.int64)] = count
        out[k] = dense.reshape(rows, HIST_BUCKETS)
    return out
