"""Leak suspects: which call stacks keep growing, as opposed to caches that fill and plateau,
data held since start-up, or churn. Computed with numpy from a capture's time series.

Per stack with outstanding bytes at the end:
- floor: at each sample, the least the stack holds from then on (what its outstanding bytes
  return to); blocks freed within the capture, however many, do not raise it;
- growth: the robust (Theil–Sen: median of pairwise slopes) trend of the floor over the whole
  capture, in bytes per minute;
- late growth: the same over the last third of the capture — still growing, or plateaued;
- never freed: the share of its allocations still outstanding;
- old: the share of its live blocks older than --min-age (from each block's age with
  --record-events, otherwise from log2 age buckets: a bucket counts once it starts at min-age).
Score: the late growth rate (bytes per minute, 0 when not growing or plateaued). A steadily
accumulating stack therefore outranks a larger cache that has stopped growing and a one-off
start-up allocation; stacks that do not grow at the end follow, by outstanding bytes. A stack
whose floor does not trend up (or whose live blocks are all young) and most of whose blocks
were freed within the capture (per-request or per-query memory, even when a request was under
way as the capture ended) is churn: not a suspect at all.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from ..capture import Capture
from ..common.format import duration_text, human_bytes
from ..reachability import categories
from ..symbolize import CUT_MARKERS

MAX_POINTS = 200   # Theil–Sen is quadratic: longer series are subsampled evenly
PLATEAU = 0.1      # late growth below this share of the overall growth: plateaued


def theil_sen(t: np.ndarray, y: np.ndarray) -> float:
    """Median slope over all pairs of points (robust to bursts); 0 for fewer than 2 points."""
    if len(t) < 2:
        return 0.0
    if len(t) > MAX_POINTS:
        pick = np.linspace(0, len(t) - 1, MAX_POINTS).astype(int)
        t, y = t[pick], y[pick]
    i, j = np.triu_indices(len(t), 1)
    dt = t[j] - t[i]
    ok = dt > 0
    return float(np.median((y[j] - y[i])[ok] / dt[ok])) if ok.any() else 0.0


def stack_series(cap: Capture) -> tuple[np.ndarray, dict]:
    """The sample times, and each stack's outstanding bytes at every sample (forward-filled
    from the times its value changed)."""
    s = cap.series
    times = np.asarray(s.get("time_s", []), np.float64)
    ids = np.asarray(s.get("stk_id", []), np.int64)
    at = np.asarray(s.get("stk_time_s", []), np.float64)
    vals = np.asarray(s.get("stk_bytes", []), np.float64)
    out = {}
    for stack in sorted(set(ids.tolist())):  # (np.unique imports numpy.ma: 14 ms a report)
        mine = ids == stack
        idx = np.searchsorted(at[mine], times, side="right") - 1
        out[int(stack)] = np.where(idx >= 0, vals[mine][np.maximum(idx, 0)], 0.0)
    return times, out


def jit_groups(cap: Capture) -> dict[int, list[int]]:
    """The stacks with outstanding bytes, as suspects see them: stacks alike up to their first
    frame outside every module (a JIT's code: HotSpot compiles a Java method again and again,
    each time at new addresses, so one leak's stack changes as its callers warm up) are one,
    under the stack holding the most; every other stack is its own. Representative -> members,
    the representative first."""
    out = cap.sites["outstanding_bytes"]
    ids = [int(i) for i in np.nonzero(out)[0]]
    mods = sorted((int(m["lo"]), int(m["hi"])) for m in cap.modules if m.get("hi"))
    lo = np.array([m[0] for m in mods], np.uint64)
    hi = np.array([m[1] for m in mods], np.uint64)
    by_key: dict = {}
    markers = np.array(list(CUT_MARKERS), np.uint64)
    for stack in ids:
        f = cap.frames(stack)
        at = np.searchsorted(lo, f, side="right") - 1
        inside = (at >= 0) & (f < hi[np.maximum(at, 0)]) if len(lo) else np.zeros(len(f), bool)
        # Only return addresses: not a Python frame's word (after the native frames, top bit
        # set) nor a cut walk's marker, also in no module (a Python program's 294 stacks of
        # distinct Python callers were one suspect "alike up to JIT-compiled code").
        jit = ~inside & (f < np.uint64(_native.PYTHON_FRAME)) & \
            ~np.isin(f, markers)
        # Up to the first frame in JIT code: what lies above it (the JIT's other frames, the
        # runtime's calls into Java, the thread's start) tells no leak apart, and a walk
        # through compiled code without frame pointers may end there or go on.
        first = int(np.argmax(jit)) if jit.any() else -1
        key = stack if first < 0 else tuple(int(x) for x in f[:first])
        by_key.setdefault(key, []).append(stack)
    groups = {}
    for members in by_key.values():
        members.sort(key=lambda s: -int(out[s]))
        groups[members[0]] = members
    return groups


def floor_series(y: np.ndarray) -> np.ndarray:
    """At each sample, the least a stack holds from then on: the floor its outstanding bytes
    return to. Blocks freed within the capture lift no floor (per-request memory, however it
    swings, stays at its floor); blocks never freed lift it for good."""
    return np.minimum.accumulate(y[::-1])[::-1] if len(y) else y


def _duration(seconds: float) -> str:
    return duration_text(seconds * 1e9)


def _rate(bytes_per_min: float) -> str:
    return human_bytes(bytes_per_min) + "/min"


def suspects(cap: Capture, min_age_s: float = 60.0, churn: list | None = None) -> list[dict]:
    """Stacks holding memory at the end that a leak hunter should look at, most suspect first
    (module docstring). Stacks whose blocks turn over (most freed within the capture) and whose
    floor does not rise are churn, not suspects: `churn` gets them, (stack, outstanding bytes,
    why)."""
    times, series = stack_series(cap)
    end_s = float(times[-1]) if len(times) else 0.0
    live = cap.live or {}
    ages = {}  # stack -> ages (s) of its live blocks, when the capture has them per block
    if live and len(live.get("stack", [])):
        age = end_s - np.asarray(live["ts"], np.float64) / 1e9
        for stack in np.unique(live["stack"]):
            ages[int(stack)] = age[live["stack"] == stack]
    age_hist = cap.behaviour["age_hist"] if cap.behaviour is not None else None
    # Otherwise log2 buckets: a bucket counts as old when it starts at min_age or later.
    old_buckets = 2.0 ** np.arange(age_hist.shape[1]) >= min_age_s * 1e9 \
        if age_hist is not None else None
    # The floor at the very end is only what the stack holds then (no later sample shows what
    # it returns to): trends are read up to a margin before the end, where later samples exist.
    step = float(np.median(np.diff(times))) if len(times) > 1 else 0.0
    margin = max(0.1 * end_s, 2 * step)
    seen = times <= end_s - margin
    if seen.sum() < 2:
        seen = np.ones(len(times), bool)
    t_seen = times[seen]
    late_from = float(t_seen[-1]) * 2 / 3 if len(t_seen) else 0.0
    leaks = categories.per_stack(cap.meta)  # the leak check at detach, if one was taken
    # What the frames in no module are: a JIT runtime's code where the process had one (a JVM,
    # Node.js, a perf map); elsewhere a walk's step through code loaded after its rows were
    # read (a heap address, 0x1), which is no JIT.
    in_no_module = "JIT-compiled code" if any(
        isinstance(c.meta.get("jit"), dict) for c in (cap.processes or [cap])) \
        else "code in no module"
    rows = []
    sites = cap.sites
    for stack, members in jit_groups(cap).items():
        out_bytes = int(sum(int(sites["outstanding_bytes"][m]) for m in members))
        check = None
        if leaks is not None:
            check = {k: sum(leaks.get(m, categories.ZERO)[k] for m in members)
                     for k in categories.FIELDS}
        lost = categories.lost_bytes(check)
        y = sum(series[m] if m in series else
                np.full(len(times), float(sites["outstanding_bytes"][m])) for m in members)
        floor = floor_series(y)[seen]
        growth = theil_sen(t_seen, floor) * 60
        late = t_seen >= late_from
        late_growth = theil_sen(t_seen[late], floor[late]) * 60 if late.sum() >= 2 else growth
        # Plateaued: the floor rose during the capture (a burst counts as much as a trend) and
        # no longer rises at the end.
        rose = float(floor[-1] - floor[0]) if len(floor) else 0.0
        plateaued = rose > 0 and late_growth <= PLATEAU * max(growth, rose / max(end_s, 1e-9) * 60)
        allocs = int(sum(int(sites["alloc_count"][m]) for m in members))
        frees = int(sum(int(sites["free_count"][m]) for m in members))
        held = int(sum(int(sites["outstanding_count"][m]) for m in members))
        never_freed = held / allocs if allocs else 0.0
        a = np.concatenate([ages.get(m, np.zeros(0)) for m in members])
        hist = sum(age_hist[m] for m in members) if age_hist is not None else None
        oldest = None
        if len(a):
            old, counted, oldest = float((a >= min_age_s).mean()), True, float(a.max())
        elif hist is not None and hist.sum():
            old = float(hist[old_buckets].sum() / hist.sum())
            counted = True
            oldest = 2.0 ** int(np.nonzero(hist)[0][-1]) / 1e9  # its bucket's start
        else:
            old, counted = 0.0, False
        # Every live block younger than the margin: nothing of it has stayed (per-request
        # memory caught in the middle of a request).
        young = oldest is not None and oldest * 2 < margin
        # Holding no more at the end than it already held in the first half: the level its
        # turnover swings through, however the samples fell in step with its cycle (its floor
        # can then look like a slow rise).
        first_half = y[times <= end_s / 2]
        cycling = len(first_half) > 0 and out_bytes <= float(first_half.max())
        # But blocks that outlived a third of the capture were kept through its cycles: a
        # collector's sawtooth or a pool drained in batches that keeps some, whose busier start
        # swung higher than anything it holds at the end (its floor rises all the same).
        kept_through = oldest is not None and oldest > end_s / 3
        if allocs and frees >= allocs / 2 and (growth <= 0 or young or
                                               (cycling and not kept_through)) and not lost:
            if churn is not None:  # turns over, its floor does not trend up: not a leak
                churn.append((stack, out_bytes, f"churn: {frees} of its {allocs} allocations "
                              "freed, " + ("every live block younger than the capture's last "
                                           f"{_duration(margin)}" if young else
                                           "holding no more at the end than it already did "
                                           "in the first half" if cycling else
                                           "its floor not rising")))
            continue
        if young:
            growth = late_growth = 0.0
            plateaued = False
        rising = np.nonzero(floor > floor[0])[0] if len(floor) else []
        span = end_s - float(t_seen[rising[0] - 1 if rising[0] else 0]) if len(rising) else 0.0
        oldest_text = f", oldest {_duration(oldest)}" if oldest else ""
        if late_growth > 0 and not plateaued:
            reasons = [f"live blocks of this stack keep accumulating: {_rate(late_growth)} at the "
                       f"end, {_rate(growth)} over {_duration(span)}{oldest_text}"]
        elif plateaued:
            top = float(floor[-1])
            reasons = [f"grew to {human_bytes(top)}, then plateaued: no growth in the last "
                       f"{_duration(end_s - late_from)} (a cache or pool that filled){oldest_text}"]
        else:
            reasons = [f"held, not growing{oldest_text}"]
        if lost:  # proven, not suspected: first
            reasons.insert(0, categories.text({k: v for k, v in check.items()
                                               if k.startswith(("definitely", "indirectly"))})
                           + " (no pointer reaches them)")
        elif (check is not None and check["reachable_count"] and not check["possibly_lost_count"]
              and (growth > 0 or plateaued)):
            reasons[0] = "growing, but held: " + reasons[0] + "; every block still reachable " \
                "(a cache or a structure that keeps them, not a leak)"
        if len(members) > 1:
            reasons.append(f"with {len(members) - 1} more stacks alike up to {in_no_module}")
        reasons.append(f"{never_freed:.0%} of its allocations never freed")
        if counted:
            reasons.append(f"{old:.0%} of its live blocks older than {min_age_s:g} s")
        rows.append({"stack": stack, "stacks": len(members), "outstanding_bytes": out_bytes,
                     "growth_bytes_per_min": round(growth, 1),
                     "late_growth_bytes_per_min": round(late_growth, 1),
                     "plateaued": bool(plateaued), "never_freed_share": round(never_freed, 4),
                     "old_share": round(old, 4),
                     "score": round(late_growth, 1) if late_growth > 0 and not plateaued else 0.0,
                     "definitely_lost_bytes": check["definitely_lost_bytes"] if check else 0,
                     "lost_bytes": lost, "reasons": reasons})
    # Blocks proven lost first (definitely, then with what they hold), then growth at the end.
    rows.sort(key=lambda r: (-r["definitely_lost_bytes"], -r["lost_bytes"], -r["score"],
                             -r["outstanding_bytes"]))
    return rows


LEFT_OUT_SHARE = 0.1  # a stack holding more of the outstanding bytes is never left out unsaid


def left_out(cap: Capture, ranked: list, shown: int, churn: list) -> list[dict]:
    """The stacks holding more than a tenth of the outstanding bytes that the suspects listed
    do not show, and why: churn, or ranked below the `shown` listed. (stack, bytes, why)"""
    total = float(cap.sites["outstanding_bytes"].sum())
    out = [{"stack": s, "outstanding_bytes": b, "why": why} for s, b, why in churn]
    out += [{"stack": r["stack"], "outstanding_bytes": r["outstanding_bytes"],
             "why": f"suspect #{n}, below the {shown} the report lists"}
            for n, r in enumerate(ranked, 1) if n > shown]
    return sorted((r for r in out if total and r["outstanding_bytes"] > LEFT_OUT_SHARE * total),
                  key=lambda r: -r["outstanding_bytes"])


def _share(part, whole) -> float:
    return round(float(part) / float(whole), 4) if whole else 0.0


def transient(cap: Capture, threshold_ns: float = 1e6, top: int = 10) -> list[dict]:
    """Stacks ranked by churn: allocations freed within `threshold_ns` (lifetime buckets that
    end at or below it), each one an allocator round trip that a stack buffer or a reused one
    would save; then stacks whose blocks are freed before their thread allocates again or by
    the call that allocated them, when the clock cannot say how soon. Also heaptrack's "temporary" (freed before its thread allocated again) and the
    share freed by the same call that allocated it (that call still on the stack at the free:
    a stack buffer would do)."""
    b = cap.behaviour
    if b is None:
        return []
    edges = 2.0 ** (np.arange(b["lifetime_hist"].shape[1]) + 1)  # bucket upper bounds, ns
    # Lifetimes known to a third, and those known only to lie under a bound: either counts once
    # its bucket ends at or below the threshold. One under a longer bound (a quiet thread's,
    # timed only by the consumer's looks at its ring) is unclassified.
    quick = (b["lifetime_hist"][:, edges <= threshold_ns].sum(axis=1)
             + b["lifetime_unresolved_hist"][:, edges <= threshold_ns].sum(axis=1))
    unclassified = b["lifetime_unresolved_hist"][:, edges > threshold_ns].sum(axis=1)
    # Freed before the thread allocated again, or by the call that allocated: short-lived
    # whatever the clock could tell.
    hints = b["temporary"].astype(np.float64) + b["freed_same_call"]
    rows = []
    for stack in np.lexsort((-hints, -quick.astype(np.float64)))[:top]:
        if quick[stack] == 0 and hints[stack] == 0:
            break
        allocs = int(cap.sites["alloc_count"][stack])
        rows.append({"stack": int(stack), "alloc_count": allocs,
                     "transient_count": int(quick[stack]),
                     "transient_share": _share(quick[stack], allocs),
                     "unclassified_count": int(unclassified[stack]),
                     "temporary_share": _share(b["temporary"][stack], allocs),
                     "same_call_share": _share(b["freed_same_call"][stack], allocs)})
    return rows


def thread_locality(cap: Capture, top: int = 10) -> list[dict]:
    """Stacks with blocks freed by another thread than the one that allocated them, most such
    frees first: who frees (same thread, another, nobody yet) and the cross-thread matrix."""
    b = cap.behaviour
    if b is None:
        return []
    rows = []
    for stack in np.argsort(-b["freed_other_thread"].astype(np.float64))[:top]:
        other = int(b["freed_other_thread"][stack])
        if other == 0:
            break
        allocs = int(cap.sites["alloc_count"][stack])
        mine = b["pair_stack"] == stack
        matrix = [{"alloc_tid": int(a), "free_tid": int(f), "count": int(c)} for a, f, c in
                  zip(b["pair_alloc_tid"][mine], b["pair_free_tid"][mine], b["pair_count"][mine])]
        rows.append({"stack": int(stack), "alloc_count": allocs,
                     "same_thread_share": _share(b["freed_same_thread"][stack], allocs),
                     "other_thread_share": _share(other, allocs),
                     "live_share": _share(cap.sites["outstanding_count"][stack], allocs),
                     "cross_thread_frees": sorted(matrix, key=lambda m: -m["count"])})
    return rows


def histograms(cap: Capture) -> dict:
    """Overall log2 histograms: element b counts sizes (bytes) / lifetimes (ns) in
    [2^b, 2^(b+1)); lifetime_under: lifetimes known only to lie under 2^(b+1) ns (shorter than
    their events' timing could tell, or than 1 µs)."""
    b = cap.behaviour
    if b is None:
        return {}
    return {"size_log2": b["size_hist"].sum(axis=0).astype(int).tolist(),
            "lifetime_ns_log2": b["lifetime_hist"].sum(axis=0).astype(int).tolist(),
            "lifetime_under_ns_log2":
                b["lifetime_unresolved_hist"].sum(axis=0).astype(int).tolist()}


def process_memory(cap: Capture) -> dict:
    """Live requested bytes against the process's anonymous resident memory (where heap blocks
    live; memhook's own rings are shared memory, counted in RSS but not here): the gap is
    allocator overhead, fragmentation and anonymous memory not allocated through malloc.
    Growth rates are robust slopes in bytes per minute."""
    s = cap.series
    if not len(s.get("anon_bytes", [])):
        return {}
    # Samples taken while the process lived (one that has exited reads as 0 bytes resident).
    alive = np.asarray(s["rss_bytes"]) > 0
    if not alive.any():
        return {}
    t = np.asarray(s["time_s"], np.float64)[alive]
    anon = np.asarray(s["anon_bytes"], np.float64)[alive]
    live = np.asarray(s["outstanding_bytes"], np.float64)[alive]
    anon_growth, live_growth = theil_sen(t, anon) * 60, theil_sen(t, live) * 60
    out = {"rss_bytes": int(np.asarray(s["rss_bytes"])[alive][-1]), "anon_bytes": int(anon[-1]),
           "heap_bytes": int(np.asarray(s["heap_bytes"])[alive][-1]), "live_bytes": int(live[-1]),
           "gap_bytes": int(anon[-1] - live[-1]),
           "anon_growth_bytes_per_min": round(anon_growth, 1),
           "live_growth_bytes_per_min": round(live_growth, 1)}
    if anon_growth > 64 * 1024 and live_growth < 0.25 * anon_growth:
        out["note"] = ("anonymous memory grows while traced live bytes do not: fragmentation, "
                       "allocator caching, or memory that is not allocated through malloc")
    return out


def stack_histograms(cap: Capture, stack: int) -> dict:
    """One stack's log2 histograms (as histograms() for the whole process)."""
    b = cap.behaviour
    if b is None:
        return {}
    return {"size_log2": b["size_hist"][stack].astype(int).tolist(),
            "lifetime_ns_log2": b["lifetime_hist"][stack].astype(int).tolist(),
            "lifetime_under_ns_log2": b["lifetime_unresolved_hist"][stack].astype(int).tolist(),
            "age_ns_log2": b["age_hist"][stack].astype(int).tolist()}
