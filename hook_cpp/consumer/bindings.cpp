// memhook._native: the consumer (consumer.h) and the segment's format as Python sees them.
// Aggregates go out as numpy columns indexed by stack id (row 0 unused), read under the lock
// the drain holds.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <map>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "area_writer.h"
#include "cfi_rows.h"
#include "consumer.h"
#include "heap_census.h"
#include "leak_check.h"
#include "module_symbols.h"
#include "operations.h"
#include "routing.h"
#include "segment.h"
#include "segment_format.h"

namespace py = pybind11;
using namespace memhook;

namespace {

struct HookInfo {
  int id;
  const char* symbol;
  const char* name;
  char kind;
};
const HookInfo kHooks[] = {
#define HOOK(id, sym, name, kind) {id, #sym, name, #kind[0]},
#include "hooks.def"
#undef HOOK
};

// Per-site fields as numpy columns named `names`, one row per stack id: of each site's Counts
// (outstanding derived, estimated in sampling mode), or of the Site itself (its behaviour).
template <class Row>
void site_columns(const Aggregates& a, py::dict& d, std::initializer_list<const char*> names,
                  std::initializer_list<uint64_t Row::*> fields) {
  auto name = names.begin();
  for (uint64_t Row::*field : fields) {
    py::array_t<uint64_t> col(a.sites().size());
    auto v = col.mutable_unchecked<1>();
    for (size_t i = 0; i < a.sites().size(); i++) {
      if constexpr (std::is_same_v<Row, Counts>)
        v(i) = a.counts(a.sites()[i]).*field;
      else
        v(i) = a.sites()[i].*field;
    }
    d[*name++] = col;
  }
}

py::dict totals(const Consumer& c) {
  auto lock = c.lock();
  const Aggregates& a = c.aggregates();
  Counts t{};
  uint64_t samples = 0;
  for (const Site& raw : a.sites()) {
    const Counts s = a.counts(raw);
    samples += raw.alloc_count;
    t.alloc_count += s.alloc_count;
    t.alloc_bytes += s.alloc_bytes;
    t.free_count += s.free_count;
    t.free_bytes += s.free_bytes;
    t.out_count += s.out_count;
    t.out_bytes += s.out_bytes;
    t.uncertain_count += s.uncertain_count;
    t.uncertain_bytes += s.uncertain_bytes;
  }
  py::dict d;
  d["alloc_count"] = t.alloc_count;
  d["alloc_bytes"] = t.alloc_bytes;
  d["free_count"] = t.free_count;
  d["free_bytes"] = t.free_bytes;
  d["outstanding_count"] = t.out_count;
  d["outstanding_bytes"] = t.out_bytes;
  d["unknown_free_count"] = a.unknown_frees();
  const Consumer::Dropped dropped = c.dropped_counts();
  d["dropped_events"] = dropped.events;
  d["dropped_frees"] = dropped.frees;
  d["waited_events"] = dropped.waits;
  d["wait_ns"] = dropped.wait_ns;
  d["wait_timeouts"] = dropped.wait_timeouts;
  d["wait_max_us"] = dropped.wait_max_us;
  d["replaced_live_count"] = a.replaced_live();
  d["reconciled_frees"] = a.reconciled_frees();
  d["dropped_frees_unchecked"] = c.reconciled() ? 0 : dropped.frees;
  d["uncertain_count"] = t.uncertain_count;
  d["uncertain_bytes"] = t.uncertain_bytes;
  d["events"] = c.applied();
  d["unordered_events"] = c.unordered();
  d["sample_rate"] = (uint64_t)a.sample_rate();
  d["sampled_allocations"] = samples;
  d["consumer_busy_ns"] = c.busy_ns();
  d["peak_bytes"] = uint64_t(std::max(0.0, std::round(a.peak_total())));
  d["peak_ts"] = a.peak_ts();  // raw clock: Consumer.ticks_to_ns
  return d;
}

py::dict sites(const Consumer& c) {
  auto lock = c.lock();
  py::dict d;
  site_columns(c.aggregates(), d,
               {"alloc_count", "alloc_bytes", "free_count", "free_bytes", "outstanding_count",
                "outstanding_bytes", "op_mask", "uncertain_count", "uncertain_bytes"},
               {&Counts::alloc_count, &Counts::alloc_bytes, &Counts::free_count,
                &Counts::free_bytes, &Counts::out_count, &Counts::out_bytes, &Counts::op_mask,
                &Counts::uncertain_count, &Counts::uncertain_bytes});
  const Aggregates& a = c.aggregates();
  py::array_t<uint64_t> peak(a.sites().size());
  auto v = peak.mutable_unchecked<1>();
  for (size_t i = 0; i < a.sites().size(); i++)
    v(i) = uint64_t(std::max(0.0, std::round(a.peak_of(a.sites()[i]))));
  d["peak_bytes"] = peak;  // outstanding at the session's peak (Aggregates::peak_of)
  return d;
}

// reachability::Category's names, as reports spell them.
constexpr const char* kLeakCategories[] = {"definitely_lost", "indirectly_lost", "possibly_lost",
                                           "reachable"};

// The census's blocks the check found lost (no stack names them: they were allocated before
// attach) by category, usable size and C++ type (the census's type id), as macOS's `leaks` and
// chap name them: [category, usable, type, blocks, bytes], the most bytes first, at most 1000.
py::list before_attach_lost(const Consumer& c, const std::vector<reachability::Block>& blocks) {
  std::map<std::tuple<int, uint64_t, uint32_t>, std::array<uint64_t, 2>> groups;
  {
    auto lock = c.lock();
    const census::CensusBlocks* cb = c.aggregates().census();
    for (const reachability::Block& b : blocks) {
      const int k = reachability::category(b.state);
      if (b.stack != reachability::kBeforeAttach || k == reachability::kStillReachable) continue;
      const census::CensusBlocks::Class* cls = cb ? cb->class_at(b.addr) : nullptr;
      auto& g = groups[{k, b.size, cls ? cls->type : 0}];
      g[0] += 1;
      g[1] += b.size;
    }
  }
  std::vector<std::pair<std::tuple<int, uint64_t, uint32_t>, std::array<uint64_t, 2>>> rows(
      groups.begin(), groups.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](auto& a, auto& b) { return a.second[1] > b.second[1]; });
  py::list out;
  for (size_t i = 0; i < rows.size() && i < 1000; i++) {
    auto& [key, n] = rows[i];
    out.append(py::make_tuple(kLeakCategories[std::get<0>(key)],
                              std::get<1>(key), std::get<2>(key), n[0], n[1]));
  }
  return out;
}

// The leak check (reachability/leak_check.h): every thread stopped, the consumer drained, the
// blocks live then (the session's and the census's still held) marked from the roots. Per
// stack: bytes and blocks definitely, indirectly, possibly lost and still reachable (stack
// BEFORE_ATTACH: the census's blocks, whose stacks nobody saw).
py::dict check_leaks(Consumer& c, int pid,
                     const std::vector<std::pair<uint64_t, uint64_t>>& not_roots,
                     bool heaps_known, double max_pause_ms, uint64_t fork_stub) {
  std::vector<reachability::Range> exclude;
  for (auto& [lo, hi] : not_roots) exclude.push_back({lo, hi});
  reachability::LeakCheck r;
  {
    py::gil_scoped_release release;
    decltype(c.lock()) held;
    // The consumer catches up first, while the target runs: what is left for the pause is
    // what the threads publish meanwhile (a burst's backlog took 200 ms of it).
    const uint64_t until = monotonic_ns() + 2000000000ull;
    while (c.drain(false) >= 4096 && monotonic_ns() < until) {
    }
    r = reachability::check_leaks(pid, exclude, heaps_known, uint64_t(max_pause_ms * 1e6),
                                  fork_stub, c.control_for_calls(), [&] {
      // What the stopped threads published (all of it: none is writing), then what that let
      // through.
      c.drain(false, true);
      c.drain(false, true);
      held = c.lock();  // no drain (its thread's) until the blocks are taken: the moment's
    }, [&] {
      std::vector<reachability::Block> blocks;
      auto lock = std::move(held);
      for (const LiveMap::Block& b : c.aggregates().live().entries())
        if (b.key) blocks.push_back({b.key, b.size, b.stack});
      if (const census::CensusBlocks* cb = c.aggregates().census())
        cb->for_each_held([&](uint64_t p, uint64_t usable) {
          blocks.push_back({p, usable, reachability::kBeforeAttach});
        });
      return blocks;
    });
  }
  py::dict d;
  d["pause_ms"] = r.pause_ns / 1e6;
  d["stop_ms"] = r.stop_ns / 1e6;
  d["drain_ms"] = r.drain_ns / 1e6;
  d["scan_ms"] = r.scan_ns / 1e6;
  if (r.forked) {  // read from the target's copy: the scan was not part of the pause
    d["forked"] = true;
    d["fork_ms"] = r.fork_ns / 1e6;
    d["reap_ms"] = r.reap_ns / 1e6;
    if (r.not_reaped) d["not_reaped"] = true;
  } else if (!r.fork_failed.empty()) {
    d["fork_failed"] = r.fork_failed;
  }
  d["threads"] = r.threads;
  d["bytes_read"] = r.bytes_read;
  d["unreadable_bytes"] = r.unreadable_bytes;
  d["root_bytes"] = py::dict(py::arg("stacks") = r.roots.stack_bytes,
                             py::arg("data") = r.roots.data_bytes,
                             py::arg("heap_gaps") = r.roots.heap_gap_bytes,
                             py::arg("dynamic_tls") = r.roots.tls_bytes,
                             py::arg("jit_code") = r.roots.jit_code_bytes,
                             py::arg("memhook") = r.roots.excluded_bytes);
  if (!r.skipped.empty()) {
    d["skipped"] = r.skipped;
    return d;
  }
  // stack -> [bytes, count] per category, in the order of reachability::Category.
  std::map<uint32_t, std::array<uint64_t, 8>> per;
  for (const reachability::Block& b : r.blocks) {
    auto& row = per[b.stack];
    const int k = reachability::category(b.state);
    row[2 * k] += b.size;
    row[2 * k + 1] += 1;
  }
  py::list rows;
  for (auto& [stack, row] : per) {
    py::list one;
    one.append(stack);
    for (uint64_t v : row) one.append(v);
    rows.append(one);
  }
  d["stacks"] = rows;
  d["blocks"] = r.blocks.size();
  d["before_attach_lost"] = before_attach_lost(c, r.blocks);
  return d;
}

// Unique stacks with ids >= since: the frames of stack since+i are
// frames[offsets[i]-offsets[0] : offsets[i+1]-offsets[0]]. With max_frames, only the stacks
// from `since` whose frames come to at most that many (one at least): a capture's stacks are
// written a bounded chunk at a time, not a copy of a Python program's 200 MB of frames at once.
py::tuple stacks(const Consumer& c, size_t since, size_t max_frames) {
  auto lock = c.lock();
  const StackTable& t = c.stacks();
  const GrownArray<uint64_t>& all = t.frames();
  size_t n = t.size();
  since = std::min(since, n);
  const size_t first = since < n ? t.offset(since) : all.size();
  if (max_frames)  // (stack `since` always: a stack longer than max_frames is not cut)
    for (size_t i = since + 1; i < n; i++)
      if (t.end(i) - first > max_frames) {
        n = i;
        break;
      }
  const size_t end = since < n ? t.end(n - 1) : all.size();
  py::array_t<uint64_t> offsets(n - since + 1);
  auto o = offsets.mutable_unchecked<1>();
  for (size_t i = since; i < n; i++) o(i - since) = t.offset(i);
  o(n - since) = end;
  py::array_t<uint64_t> frames(end - first);
  if (end > first) std::memcpy(frames.mutable_data(), all.data() + first, (end - first) * 8);
  return py::make_tuple(offsets, frames);
}

// One stack's frames (none for an id not interned yet): what a live view shows of a few.
py::array_t<uint64_t> stack(const Consumer& c, size_t id) {
  auto lock = c.lock();
  const StackTable& t = c.stacks();
  if (id >= t.size()) return py::array_t<uint64_t>(0);
  const size_t first = t.offset(id), end = t.end(id);
  py::array_t<uint64_t> out(end - first);
  if (end > first) std::memcpy(out.mutable_data(), t.frames().data() + first, (end - first) * 8);
  return out;
}

// Every block still live: ptr, size, stack, tid, ts (raw clock), as parallel numpy arrays.
py::dict live_blocks(const Consumer& c) {
  auto lock = c.lock();
  const LiveMap& live = c.aggregates().live();
  size_t n = live.size(), j = 0;
  py::array_t<uint64_t> ptr(n), size(n), ts(n);
  py::array_t<uint32_t> stack(n), tid(n);
  auto P = ptr.mutable_unchecked<1>(), S = size.mutable_unchecked<1>(), T = ts.mutable_unchecked<1>();
  auto K = stack.mutable_unchecked<1>(), D = tid.mutable_unchecked<1>();
  for (const LiveMap::Block& b : live.entries()) {
    if (!b.key) continue;
    P(j) = b.key;
    S(j) = b.size;
    T(j) = b.ts;
    K(j) = b.stack;
    D(j) = b.tid;
    j++;
  }
  py::dict d;
  d["ptr"] = ptr;
  d["size"] = size;
  d["ts"] = ts;
  d["stack"] = stack;
  d["tid"] = tid;
  return d;
}

// Behaviour per stack: free locality, temporaries (rows by stack id), size and lifetime
// histograms and the ages of live blocks (sparse), and (stack, alloc tid, free tid, count) for
// every cross-thread pair seen.
py::dict behaviour(const Consumer& c) {
  auto lock = c.lock();
  const Aggregates& a = c.aggregates();
  size_t n = a.sites().size();
  py::dict d;
  site_columns(a, d, {"freed_same_thread", "freed_other_thread", "temporary", "freed_same_call"},
               {&Site::freed_same_thread, &Site::freed_other_thread, &Site::temporary,
                &Site::freed_same_call});
  // The histograms sparse (capture/format.py's BEHAVIOUR_SPARSE): NAME_at, the flat index
  // stack * HISTOGRAM_BUCKETS + bucket of each non-zero count, and NAME_count.
  auto put = [&d](const char* name, const std::vector<uint64_t>& at,
                  const std::vector<uint64_t>& count) {
    d[py::str(std::string(name) + "_at")] = py::array_t<uint64_t>(at.size(), at.data());
    d[py::str(std::string(name) + "_count")] = py::array_t<uint64_t>(count.size(), count.data());
  };
  for (auto [name, hist] : {std::make_pair("size_hist", &a.size_hist()),
                            std::make_pair("lifetime_hist", &a.life_hist()),
                            std::make_pair("lifetime_unresolved_hist", &a.unresolved_hist())}) {
    std::vector<uint64_t> at, count;
    hist->sparse(n, at, count);
    put(name, at, count);
  }
  // Ages of the blocks live now, per stack: bounded by the stacks, however large the heap.
  std::vector<uint64_t> ages;
  ages.reserve(a.live().size());
  const uint64_t now = c.now();
  const double per_tick = c.ticks_to_ns();
  for (const LiveMap::Block& b : a.live().entries())
    if (b.key && b.stack < n)
      ages.push_back(size_t(b.stack) * kBuckets +
                     log2_bucket(now > b.ts ? (uint64_t)((now - b.ts) * per_tick) : 0));
  std::sort(ages.begin(), ages.end());
  std::vector<uint64_t> age_at, age_count;
  for (size_t i = 0; i < ages.size(); i++) {
    if (age_at.empty() || age_at.back() != ages[i]) {
      age_at.push_back(ages[i]);
      age_count.push_back(0);
    }
    age_count.back()++;
  }
  put("age_hist", age_at, age_count);
  std::vector<uint64_t> stack, atid, ftid, count;
  a.each_thread_pair([&](const Aggregates::ThreadPair& k, uint64_t n) {
    stack.push_back(k.stack);
    atid.push_back(k.alloc_tid);
    ftid.push_back(k.free_tid);
    count.push_back(n);
  });
  d["pair_stack"] = py::array_t<uint64_t>(stack.size(), stack.data());
  d["pair_alloc_tid"] = py::array_t<uint64_t>(atid.size(), atid.data());
  d["pair_free_tid"] = py::array_t<uint64_t>(ftid.size(), ftid.data());
  d["pair_count"] = py::array_t<uint64_t>(count.size(), count.data());
  return d;
}

// The events applied since the last call, as raw bytes of LoggedEvent records.
py::bytes take_events(Consumer& c) {
  auto lock = c.lock();
  const std::vector<LoggedEvent> log = c.aggregates().take_events();
  return py::bytes((const char*)log.data(), log.size() * sizeof(LoggedEvent));
}

// The slots the target patched itself (libraries loaded after attach).
std::vector<py::tuple> late_slots(const Consumer& c) {
  std::vector<py::tuple> out;
  const Control& ctl = c.control();
  uint32_t n = std::min<uint32_t>(__atomic_load_n(&ctl.nlate, __ATOMIC_ACQUIRE), kMaxLateSlots);
  for (uint32_t i = 0; i < n; i++) {
    const PatchedSlot& s = ctl.late[i];
    out.push_back(py::make_tuple(s.addr, s.original, s.hook, s.hook_id, s.state));
  }
  return out;
}

// An object file's unwind rows (unwind/cfi_rows.h) as the bytes of Row records, and what was
// found.
py::tuple rows_of_file(const std::string& path) {
  CfiRows r;
  {
    py::gil_scoped_release unlocked;
    r = cfi_rows(path);
  }
  py::dict info;
  info["source"] = r.source;
  info["problem"] = r.problem;
  info["fdes"] = r.fdes;
  info["stop_rows"] = r.stop_rows;
  info["functions"] = r.functions;
  info["main"] = r.main;
  info["main_end"] = r.main_end;
  return py::make_tuple(py::bytes((const char*)r.rows.data(), r.rows.size() * sizeof(Row)), info);
}

uint32_t add_rows(Consumer& c, const py::bytes& rows) {
  const std::string_view v = rows;
  if (v.size() % sizeof(Row)) throw std::invalid_argument("rows must be whole Row records");
  return unwind_add_rows(c.unwind_area(), (const Row*)v.data(), v.size() / sizeof(Row));
}

void publish(Consumer& c, const std::vector<std::tuple<uint64_t, uint64_t, uint64_t, uint32_t,
                                                        uint32_t>>& objects) {
  std::vector<UnwindObject> index;
  for (auto& [lo, hi, bias, first, nrows] : objects) index.push_back({lo, hi, bias, first, nrows});
  unwind_publish(c.unwind_area(), std::move(index));
  c.forget_recent_stacks();
}

// The heap census (census/heap_census.h) as a dict of plain values; counts as (count, bytes).
py::dict census_dict(const census::Census& c) {
  using census::Tally;
  auto tally = [](const Tally& t) { return py::make_tuple(t.count, t.bytes); };
  py::dict d;
  d["problem"] = c.problem;
  d["main_arena"] = c.main_arena;
  py::list arenas;
  for (const census::ArenaStats& as : c.arenas) {
    py::dict a;
    a["address"] = as.arena.addr;
    a["main"] = as.arena.main;
    a["system_mem"] = as.arena.system_mem;
    a["top"] = as.arena.top;
    a["top_bytes"] = as.arena.top_size;
    a["top_resident"] = as.top_resident;
    a["bins"] = tally(as.bins);
    a["fastbins"] = tally(as.fastbins);
    a["tcache"] = tally(as.tcache);
    a["largest_free"] = as.largest_free;
    a["trimmable"] = as.trimmable;
    a["uncertain"] = as.uncertain;
    a["problems"] = as.arena.problems;
    py::list heaps;
    for (const census::HeapStats& hs : as.heaps) {
      py::dict h;
      h["lo"] = hs.heap.lo;
      h["hi"] = hs.heap.hi;
      h["first"] = hs.heap.first;
      h["end"] = hs.heap.end;
      h["has_top"] = hs.heap.has_top;
      h["walked_to"] = hs.walked_to;
      h["chunks"] = hs.chunks;
      h["live"] = tally(hs.live);
      h["live_end"] = hs.live_end;
      h["last_live"] = py::make_tuple(hs.last_live, hs.last_live_size, hs.last_live_type);
      h["resident"] = hs.resident;
      h["resident_live"] = hs.resident_live;
      h["resident_free"] = hs.resident_free;
      h["problem"] = hs.problem;
      heaps.append(h);
    }
    a["heaps"] = heaps;
    arenas.append(a);
  }
  d["arenas"] = arenas;
  d["mmapped"] = tally(c.mmapped);
  d["mmapped_resident"] = c.mmapped_resident;
  d["mmapped_unsearched"] = c.mmapped_unsearched;
  d["mmapped_ranges"] = c.mmapped_ranges;
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t>> sizes;
  for (auto& [size, t] : c.by_size)
    if (t.count) sizes.emplace_back(size, t.count, t.bytes);
  std::sort(sizes.begin(), sizes.end());
  d["by_size"] = sizes;
  py::list types;
  for (size_t i = 1; i < c.types.size() && i < c.by_type.size(); i++)
    types.append(py::make_tuple(c.types[i].vtable, py::bytes(c.types[i].name), c.types[i].module,
                                c.by_type[i].count, c.by_type[i].bytes));
  d["types"] = types;
  d["untyped"] = tally(c.by_type.empty() ? Tally{} : c.by_type[0]);
  d["tcache_structs"] = c.tcache_structs;
  d["uncertain"] = c.uncertain;
  d["heap_bytes"] = c.heap_bytes;
  d["bytes_read"] = c.bytes_read;
  d["elapsed_ns"] = c.elapsed_ns;
  d["blocks"] = c.blocks ? py::cast(c.blocks) : py::none();
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "memhook native consumer: shared segment, ring draining, per-stack aggregation";
  m.def("hooks", [] {
    std::vector<py::tuple> out;
    for (const HookInfo& h : kHooks)
      out.push_back(py::make_tuple(h.id, h.symbol, h.name, std::string(1, h.kind),
                                   (int)kOperations.bit[h.id]));
    return out;
  });
  m.def(
      "entry_symbol",
      [](const std::string& symbol, uint64_t sample_rate, bool size_filter) {
        for (const HookInfo& h : kHooks)
          if (symbol == h.symbol)
            return kEntryPrefix[entry_for(h.kind, sample_rate, size_filter)] + symbol;
        throw std::invalid_argument("not a hooked function: " + symbol);
      },
      py::arg("symbol"), py::arg("sample_rate"), py::arg("size_filter"),
      "The hook library's entry a slot of `symbol` gets (common/routing.h).");
  m.def(
      "format_segment",
      [](int fd, uint32_t nrings, uint32_t ring_bytes, uint32_t depth, uint32_t clock,
         uint64_t min_size, uint64_t max_size, uint64_t pid,
         const std::unordered_map<int, uint64_t>& real, const std::vector<uint64_t>& known,
         double abandon_after_s, uint64_t sample_rate, bool no_avx512, uint64_t unwind_bytes,
         uint64_t owner_pid, uint64_t owner_start,
         const std::vector<std::tuple<uint64_t, uint32_t, uint64_t, uint64_t, uint64_t, bool>>&
             slots,
         uint64_t entry_area, uint32_t entry_area_bytes,
         const std::vector<std::tuple<uint64_t, uint32_t, uint64_t, uint32_t, py::bytes,
                                      py::bytes>>& entries,
         uint64_t max_wait_ns, bool lossless, uint64_t python_bytes) {
        std::vector<PlannedSlot> plan;
        for (auto& [addr, id, real_fn, lo, hi, ro] : slots)
          plan.push_back(PlannedSlot{addr, id, real_fn, lo, hi, ro});
        std::vector<PlannedEntry> planned;
        for (auto& [addr, id, cell, length, original, trampoline] : entries)
          planned.push_back(PlannedEntry{addr, cell, id, length, std::string(original),
                                         std::string(trampoline)});
        format_segment(fd, nrings, ring_bytes, depth, clock, min_size, max_size, pid, real,
                       known, abandon_after_s, sample_rate, no_avx512, unwind_bytes, owner_pid,
                       owner_start, plan, entry_area, entry_area_bytes, planned, max_wait_ns,
                       lossless, python_bytes);
      },
      py::arg("fd"), py::arg("nrings"), py::arg("ring_bytes"), py::arg("depth"),
      py::arg("clock"), py::arg("min_size"), py::arg("max_size"), py::arg("pid"),
      py::arg("real"), py::arg("known"), py::arg("abandon_after_s"),
      py::arg("sample_rate") = 0, py::arg("no_avx512") = false, py::arg("unwind_bytes") = 0,
      py::arg("owner_pid") = 0, py::arg("owner_start") = 0,
      py::arg("slots") = std::vector<std::tuple<uint64_t, uint32_t, uint64_t, uint64_t, uint64_t, bool>>{},
      py::arg("entry_area") = 0, py::arg("entry_area_bytes") = 0,
      py::arg("entries") = std::vector<std::tuple<uint64_t, uint32_t, uint64_t, uint32_t,
                                                  py::bytes, py::bytes>>{},
      py::arg("max_wait_ns") = 0, py::arg("lossless") = false, py::arg("python_bytes") = 0,
      "Size and fill a new segment; `slots`: (address, hook id, real function, PLT lo, PLT hi, "
      "read-only) of each slot to patch (the hook library decides, target stopped); `entries`: "
      "(address, hook id, cell, length, first 32 bytes, trampoline) of each entry to patch in "
      "the area [entry_area, +entry_area_bytes).");
  m.def(
      "heap_census",
      [](int mem_fd, int pagemap_fd, int minor,
         std::vector<std::pair<uint64_t, uint64_t>> libc_data, std::pair<uint64_t, uint64_t> heap,
         std::vector<std::pair<uint64_t, uint64_t>> anonymous,
         std::vector<std::tuple<uint64_t, uint64_t, int32_t, bool>> files,
         std::vector<uint64_t> type_info_vtables, bool keep_blocks) {
        census::CensusInput in;
        in.minor = minor;
        in.libc_data = std::move(libc_data);
        in.heap_lo = heap.first;
        in.heap_hi = heap.second;
        in.anonymous = std::move(anonymous);
        for (auto& [lo, hi, module, exec] : files) in.files.push_back({lo, hi, module, exec});
        in.type_info_vtables = std::move(type_info_vtables);
        census::Census c;
        {
          py::gil_scoped_release unlocked;
          c = census::HeapCensus(mem_fd, pagemap_fd, std::move(in), keep_blocks).run();
        }
        return census_dict(c);
      },
      py::arg("mem_fd"), py::arg("pagemap_fd"), py::arg("glibc_minor"), py::arg("libc_data"),
      py::arg("heap"), py::arg("anonymous"), py::arg("files"), py::arg("type_info_vtables"),
      py::arg("keep_blocks") = false,
      "Walk glibc malloc's heap in a running process (census/heap_census.h), reading its "
      "/proc/PID/mem and /proc/PID/pagemap fds; `keep_blocks`: its result's \"blocks\" are "
      "the live blocks found, for Consumer.match_census.");
  m.def(
      "glibc_main_arena",
      [](int mem_fd, int minor, const std::vector<std::pair<uint64_t, uint64_t>>& libc_data,
         std::pair<uint64_t, uint64_t> heap) {
        census::TargetMemory mem(mem_fd);
        const census::MallocLayout l = census::MallocLayout::of(minor);
        const uint64_t a = census::find_main_arena(mem, l, libc_data, heap.first, heap.second);
        return py::make_tuple(a, a ? l.state_bytes : 0);
      },
      py::arg("mem_fd"), py::arg("glibc_minor"), py::arg("libc_data"), py::arg("heap"),
      "glibc's main_arena (address, bytes of its malloc_state), found as the census finds it; "
      "(0, 0) if not found.");
  py::class_<census::CensusBlocks, std::shared_ptr<census::CensusBlocks>>(m, "CensusBlocks")
      .def("memory_bytes", &census::CensusBlocks::memory_bytes);
  m.def("function_table", [](const std::vector<std::string>& paths) {
        FunctionTable t = function_table(paths);
        return py::make_tuple(py::array_t<uint64_t>(t.starts.size(), t.starts.data()),
                              py::array_t<uint64_t>(t.ends.size(), t.ends.data()), t.names);
      }, py::arg("paths"),
      "The functions of these files' symbol tables: (starts, ends, names) sorted by address, "
      "one name per address (symbolize/module_symbols.h).");
  py::class_<DwarfLines>(m, "DwarfLines")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def_property_readonly("ok", &DwarfLines::ok)
      .def("locate", [](DwarfLines& d, const std::vector<uint64_t>& vaddrs) {
            py::dict out;
            auto text = [](const std::string& s) -> py::object {
              if (s.empty()) return py::none();
              return py::reinterpret_steal<py::object>(
                  PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace"));
            };
            for (uint64_t a : vaddrs) {
              std::vector<SourceFrame> frames = d.locate(a);
              if (frames.empty()) continue;
              py::list l;
              for (const SourceFrame& f : frames)
                l.append(py::make_tuple(text(f.function), text(f.file),
                                        f.line ? py::object(py::int_(f.line)) : py::none()));
              out[py::int_(a)] = l;
            }
            return out;
          }, py::arg("vaddrs"),
          "{vaddr: [(function, file, line)] innermost first} for the addresses DWARF places.");
  m.def("cfi_rows", &rows_of_file, py::arg("path"),
        "An object file's call-frame information as unwind rows (bytes of Row records), and a "
        "dict saying where they came from.");
  m.attr("STATS_KINDS") = py::dict(py::arg("jemalloc") = int(kStatsJemalloc),
                                   py::arg("tcmalloc") = int(kStatsTcmalloc),
                                   py::arg("mimalloc") = int(kStatsMimalloc));
  m.attr("STATS_STATES") = py::dict(py::arg("idle") = int(kStatsIdle),
                                    py::arg("running") = int(kStatsRunning),
                                    py::arg("done") = int(kStatsDone),
                                    py::arg("failed") = int(kStatsFailed));
  m.attr("STATS_NONE") = kStatsNone;
  m.attr("ROW_BYTES") = sizeof(Row);
  m.attr("ROW_SIGNAL") = uint32_t(kRowSignal);
  m.attr("ROW_LAST") = kRowLast;
  m.attr("FRAME_NO_UNWIND_INFO") = kFrameNoUnwindInfo;
  m.attr("FRAME_UNWIND_STOPPED") = kFrameUnwindStopped;
  m.attr("PYTHON_FRAME") = kPythonFrame;
  m.attr("PYTHON_ENTRY") = kPythonEntry;
  m.attr("PYTHON_CODE_SHIFT") = kPythonCodeShift;
  m.attr("PYTHON_UNREADABLE") = kPythonUnreadable;
  m.attr("PYTHON_DEPTH") = kPythonDepth;
  m.attr("CODE_RECORD_BYTES") = sizeof(CodeRecord);
  m.attr("CODE_TABLE_CUT") = kCodeTableCut;
  m.attr("MAX_RECORD_FRAMES") = kMaxRecordFrames;
  m.def(
      "segment_layout",
      [](uint32_t nrings, uint32_t ring_bytes, uint32_t depth) {
        py::dict d;
        d["control_bytes"] = sizeof(Control);
        d["rings_offset"] = rings_offset();
        d["ring_stride"] = ring_stride(ring_bytes);
        d["ring_header_bytes"] = sizeof(RingHeader);
        d["recent_stacks_offset"] = recent_stacks_offset(nrings, ring_bytes);
        d["segment_bytes"] = segment_bytes(nrings, ring_bytes, depth);
        d["unwind_offset"] = unwind_offset(nrings, ring_bytes, depth);
        return d;
      },
      py::arg("nrings"), py::arg("ring_bytes"), py::arg("depth"),
      "Where a segment's parts lie (segment.h), for tests that read or forge its bytes.");
  m.def(
      "decode_records",
      [](py::bytes ring, uint64_t start, uint64_t end) {
        // A ring's bytes as the consumer reads them (record_format.h): for each record from
        // cursor `start` to `end`, (cursor, kind, op, nframes, aux, header, words after the
        // header); padding moves on to the ring's start; a malformed record ends the list with
        // (cursor, None, ...).
        const std::string data = ring;
        const uint64_t cap = data.size();
        if (cap < 8 || (cap & (cap - 1))) throw std::invalid_argument("a ring is a power of two");
        if (end - start > cap) throw std::invalid_argument("more than a ring between the cursors");
        py::list out;
        for (uint64_t rd = start; rd != end;) {
          RecordAt r;
          const Next next = next_record((const uint8_t*)data.data(), cap, rd, end - rd, &r);
          if (next == Next::kMalformed) {
            out.append(py::make_tuple(rd, py::none(), r.h.op, r.h.nframes, r.h.aux, r.at[0],
                                      py::list()));
            break;
          }
          if (next == Next::kRecord) {
            py::list words;
            for (uint64_t i = 1; i < r.bytes / 8; i++) words.append(r.at[i]);
            out.append(py::make_tuple(rd, r.h.kind, r.h.op, r.h.nframes, r.h.aux, r.at[0], words));
          }
          rd += r.bytes;
        }
        return out;
      },
      py::arg("ring"), py::arg("start"), py::arg("end"),
      "The records of a ring's bytes, decoded as the consumer decodes them.");
  m.def(
      "record_header",
      [](uint8_t kind, int op, uint64_t nframes, uint64_t aux) {
        return header(EventKind(kind), op, nframes, aux);
      },
      py::arg("kind"), py::arg("op") = 0, py::arg("nframes") = 0, py::arg("aux") = 0,
      "A record's header word, as the hooks write it (record_format.h).");
  m.attr("RECORD_KINDS") = py::dict(py::arg("padding") = int(kPadding), py::arg("alloc") = int(kAlloc),
                                    py::arg("free") = int(kFree), py::arg("realloc") = int(kRealloc),
                                    py::arg("nop") = int(kNop), py::arg("time") = int(kTime),
                                    py::arg("thread") = int(kThread));
  {
    py::dict relocs;  // type -> (name, only with addend 0): arch.h's, for memhook/common/arch.py
    for (const arch::SlotRelocation& r : arch::kSlotRelocations)
      relocs[py::int_(r.type)] = py::make_tuple(r.name, r.zero_addend);
    m.attr("SLOT_RELOCATIONS") = relocs;
  m.attr("ARCH_NAME") = arch::kName;  // the processor this build is for (arch.h)
  m.attr("PTR_BITS") = kPtrBits;       // a ring's pointer word: the pointer's bits (record_format.h)
  }
  m.def("xsave_bytes", &arch::xsave_bytes,
        "The XSAVE area's size for the features this kernel enabled (arch.h).");
  m.attr("MAX_DEPTH") = kMaxDepth;
  m.attr("MAX_RINGS") = kMaxRings;
  m.attr("MAX_WAIT_NS") = kMaxWaitNs;
  m.attr("HISTOGRAM_BUCKETS") = kBuckets;
  // Where memhook's detach script finds the late-patched slots in the target's copy.
  m.attr("CONTROL_NLATE_OFFSET") = offsetof(Control, nlate);
  m.attr("CONTROL_OWNER_OFFSET") = offsetof(Control, owner_pid);  // then owner_start
  m.attr("CONTROL_LATE_OFFSET") = offsetof(Control, late);
  m.attr("CONTROL_NSLOTS_OFFSET") = offsetof(Control, nslots);
  m.attr("CONTROL_SLOTS_OFFSET") = offsetof(Control, slots);
  m.attr("CONTROL_HEARTBEAT_OFFSET") = offsetof(Control, heartbeat_ns);
  m.attr("SLOT_BYTES") = sizeof(PatchedSlot);
  m.attr("CONTROL_NENTRIES_OFFSET") = offsetof(Control, nentries);
  m.attr("CONTROL_ENTRIES_OFFSET") = offsetof(Control, entries);
  m.attr("ENTRY_BYTES") = sizeof(EntryPatch);
  m.attr("ENTRY_CELL") = kEntryCell;
  m.attr("ENTRY_STUB") = kEntryStub;
  m.attr("ENTRY_ORIGINAL") = kEntryOriginal;
  m.attr("ENTRY_ADDR_OFFSET") = offsetof(EntryPatch, addr);
  m.attr("ENTRY_LENGTH_OFFSET") = offsetof(EntryPatch, length);
  m.attr("ENTRY_STATE_OFFSET") = offsetof(EntryPatch, state);
  m.attr("MAX_ENTRIES") = kMaxEntries;
  {
    py::dict states;
    for (auto [name, v] : {std::pair<const char*, int>{"planned", kEntryPlanned},
                           {"patched", kEntryPatched}, {"changed", kEntryChanged},
                           {"refused", kEntryRefused}, {"restored", kEntryRestored},
                           {"kept", kEntryKept}})
      states[name] = v;
    m.attr("ENTRY_STATES") = states;
  }
  // A PatchedSlot's fields as (offset, size), for the GDB agent that writes and reads them.
  py::dict slot_fields;
#define FIELD(f) slot_fields[#f] = py::make_tuple(offsetof(PatchedSlot, f), sizeof(PatchedSlot::f))
  FIELD(addr);
  FIELD(original);
  FIELD(hook);
  FIELD(hook_id);
  FIELD(state);
  FIELD(readonly);
#undef FIELD
  m.attr("SLOT_FIELDS") = slot_fields;
  m.attr("SLOT_PATCHED") = (int)kSlotPatched;
  m.attr("SLOT_STATES") = py::dict(py::arg("planned") = (int)kSlotPlanned,
                                   py::arg("patched") = (int)kSlotPatched,
                                   py::arg("skipped") = (int)kSlotSkipped,
                                   py::arg("unreadable") = (int)kSlotUnreadable,
                                   py::arg("restored") = (int)kSlotRestored,
                                   py::arg("rebound") = (int)kSlotRebound,
                                   py::arg("gone") = (int)kSlotGone);
  m.attr("MAX_SLOTS") = kMaxSlots;
  m.attr("MAX_LATE_SLOTS") = kMaxLateSlots;
  m.attr("LOGGED_EVENT_BYTES") = sizeof(LoggedEvent);
  m.attr("CLOCK_TSC") = (int)kClockTsc;
  m.attr("MODE_OFF") = (int)kOff;
  m.attr("BEFORE_ATTACH") = reachability::kBeforeAttach;
  m.attr("LEAK_CATEGORIES") = py::make_tuple(kLeakCategories[0], kLeakCategories[1],
                                             kLeakCategories[2], kLeakCategories[3]);
  m.attr("EXEC_FAILED") = (int)kExecFailed;
  m.attr("SPAWN_ANNOUNCED") = (int)kSpawnAnnounced;
  m.attr("CLOCK_MONOTONIC") = (int)kClockMonotonic;
  py::class_<Consumer>(m, "Consumer")
      .def(py::init<int>(), py::arg("segment_fd"))
      // (Python's drains apply all that was published: a snapshot's, a tick's, the final one.)
      .def("drain", [](Consumer& c, bool final) { return c.drain(final, true); },
           py::arg("final") = false, py::call_guard<py::gil_scoped_release>())
      .def("start", &Consumer::start, py::arg("busy_us") = 1000, py::arg("idle_us") = 10000)
      .def("stop", &Consumer::stop, py::call_guard<py::gil_scoped_release>())
      .def("totals", &totals)
      .def("reconcile", &Consumer::reconcile, py::arg("mem_fd"))
      .def("loads", &Consumer::loads)
      .def("loads_read", &Consumer::loads_read)
      .def("set_follow_forks", &Consumer::set_follow_forks)
      .def(
          "set_python",
          [](Consumer& c, const py::dict& d) {
            PythonLayout l{};
            auto get = [&](const char* k, auto* field) {
              if (!d.contains(k)) throw std::invalid_argument(std::string("python layout: ") + k);
              *field = py::cast<std::remove_pointer_t<decltype(field)>>(d[k]);
            };
#define MEMHOOK_FIELD(f) get(#f, &l.f);
            MEMHOOK_FIELD(this_thread_state) MEMHOOK_FIELD(code_type) MEMHOOK_FIELD(unicode_type)
            MEMHOOK_FIELD(bytes_type) MEMHOOK_FIELD(type_type) MEMHOOK_FIELD(minor)
            MEMHOOK_FIELD(depth)
            MEMHOOK_FIELD(tstate_frame) MEMHOOK_FIELD(cframe_current)
            MEMHOOK_FIELD(frame_previous) MEMHOOK_FIELD(frame_code) MEMHOOK_FIELD(frame_instr)
            MEMHOOK_FIELD(frame_owner) MEMHOOK_FIELD(frame_is_entry) MEMHOOK_FIELD(instr_kind)
            MEMHOOK_FIELD(run_kind) MEMHOOK_FIELD(owner_generator) MEMHOOK_FIELD(owner_cstack)
            MEMHOOK_FIELD(code_name) MEMHOOK_FIELD(code_filename) MEMHOOK_FIELD(code_firstlineno)
            MEMHOOK_FIELD(code_linetable) MEMHOOK_FIELD(code_firsttraceable)
            MEMHOOK_FIELD(code_units) MEMHOOK_FIELD(code_consts) MEMHOOK_FIELD(str_length) MEMHOOK_FIELD(str_state)
            MEMHOOK_FIELD(str_ascii_data) MEMHOOK_FIELD(str_compact_data)
            MEMHOOK_FIELD(bytes_size) MEMHOOK_FIELD(bytes_data)
            MEMHOOK_FIELD(mem_allocator) MEMHOOK_FIELD(obj_allocator)
#undef MEMHOOK_FIELD
            c.set_python(l);
          },
          py::arg("layout"),
          "Where the target's CPython keeps frames and names (PythonLayout), before injection.")
      .def(
          "code_records",
          [](const Consumer& c, uint64_t from) {
            auto [data, next] = c.code_records(from);
            return py::make_tuple(py::bytes(data), next);
          },
          py::arg("from_byte"),
          "(the code records completed from `from_byte` on, the byte after them).")
      .def("python_unrecorded", &Consumer::python_unrecorded)
      .def("python_allocators_hooked",
           [](const Consumer& c) { return c.control().python.allocators_hooked != 0; })
      .def("set_check_at_exit", &Consumer::set_check_at_exit)
      .def("exit_announced", &Consumer::exit_announced)
      .def("exit_done", &Consumer::exit_done)
      .def("forked", &Consumer::forked)
      .def("release_forked", &Consumer::release_forked)
      .def("exec_announced", &Consumer::exec_announced)
      .def("exec_state", &Consumer::exec_state)
      .def("exec_go", &Consumer::exec_go)
      .def("exec_done", &Consumer::exec_done)
      .def("unwind_add_rows", &add_rows, py::arg("rows"),
           "Append rows to the segment's unwind area; returns the first's index.")
      .def("unwind_publish", &publish, py::arg("objects"),
           "Publish [(lo, hi, bias, first, nrows)] as the objects the hooks unwind through.")
      .def("sites", &sites)
      .def("stacks", &stacks, py::arg("since") = 0, py::arg("max_frames") = 0)
      .def("stack", &stack, py::arg("id"))
      .def("record_events",
           [](Consumer& c, bool on) {
             auto lock = c.lock();
             c.aggregates().record_events(on);
           })
      .def("live_blocks", &live_blocks)
      .def("check_leaks", &check_leaks, py::arg("pid"), py::arg("not_roots"),
           py::arg("heaps_known"), py::arg("max_pause_ms"), py::arg("fork_stub") = 0)
      .def("behaviour", &behaviour)
      .def("take_events", &take_events)
      .def("late_slots", &late_slots)
      .def("any_busy", &Consumer::any_busy)
      .def("match_census",
           [](Consumer& c, std::shared_ptr<census::CensusBlocks> blocks) {
             auto lock = c.lock();
             c.aggregates().match_census(std::move(blocks));
           },
           py::arg("blocks"),
           "Match the frees of pointers never seen allocated to the census's blocks.")
      .def("mappings",
           [](const Consumer& c) {
             // The program's anonymous mappings (mappings.h): per stack (maps, mapped,
             // unmapped, released bytes), the ranges mapped now (start, end, stack), and the
             // bytes unmapped that no known mapping held.
             auto lock = c.lock();
             const Mappings& m = c.mappings();
             std::vector<std::tuple<uint32_t, uint64_t, uint64_t, uint64_t, uint64_t>> stacks;
             for (size_t i = 0; i < m.per_stack().size(); i++) {
               const Mappings::PerStack& s = m.per_stack()[i];
               if (s.maps) stacks.emplace_back(uint32_t(i), s.maps, s.mapped, s.unmapped, s.released);
             }
             std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> ranges;
             for (const auto& [lo, r] : m.regions()) ranges.emplace_back(lo, r.end, r.stack);
             return py::make_tuple(stacks, ranges, m.unknown_unmapped());
           })
      .def("set_allocator_stats", &Consumer::set_allocator_stats, py::arg("fn"), py::arg("kind"))
      .def("allocator_stats", &Consumer::allocator_stats)
      .def("census_classes",
           [](const Consumer& c) {
             // (usable, type id, blocks at the census, freed since) per class with blocks.
             auto lock = c.lock();
             std::vector<std::tuple<uint64_t, uint32_t, uint64_t, uint64_t>> out;
             if (const census::CensusBlocks* b = c.aggregates().census())
               for (const auto& k : b->classes())
                 if (k.blocks) out.emplace_back(k.usable, k.type, k.blocks, k.freed);
             return out;
           })
      .def("release_rings", &Consumer::release_rings, py::call_guard<py::gil_scoped_release>())
      .def("ticks_to_ns", &Consumer::ticks_to_ns)
      .def("now", &Consumer::now, "The session's clock now (raw, as events are timed).")
      .def_property_readonly("clock_origin", &Consumer::clock_origin)
      .def_property_readonly("started", &Consumer::started)
      .def_property_readonly("abandoned", &Consumer::abandoned)
      .def_property_readonly("lib_base", &Consumer::lib_base);
}
