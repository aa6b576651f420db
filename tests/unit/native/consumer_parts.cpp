// The consumer's parts on their own, without a segment or a target: the stack table, the live
// map, the sparse histograms, event timing, and the processor's folder (arch.h) as the consumer uses it. Built for the
// host, and for AArch64 run under qemu-user. Built and run by tests/unit/test_native.py; prints one line per failed
// check and "checks N failed M" at the end.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <map>
#include <random>
#include <vector>

#include "arch.h"
#include "event_times.h"
#include "live_map.h"
#include "sparse_histograms.h"
#include "stack_table.h"

using namespace memhook;

static int g_checks, g_failed;
#define CHECK(cond)                                                    \
  do {                                                                 \
    g_checks++;                                                        \
    if (!(cond)) {                                                     \
      g_failed++;                                                      \
      printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);         \
    }                                                                  \
  } while (0)

static void stack_table() {
  StackTable t;
  CHECK(t.size() == 1);  // id 0: none
  const uint64_t a[] = {0x401000, 0x402000, 0x403000}, b[] = {0x401000, 0x402000},
                 c[] = {0x401000, 0x402000, 0x403001};
  const uint32_t ia = t.intern(a, 3), ib = t.intern(b, 2), ic = t.intern(c, 3);
  CHECK(ia == 1 && ib == 2 && ic == 3);  // ids in order of first sight
  CHECK(t.intern(a, 3) == ia && t.intern(b, 2) == ib && t.intern(c, 3) == ic);
  CHECK(t.size() == 4);
  const auto& f = t.frames();
  CHECK(f.size() == 8 && f[t.offset(ib)] == 0x401000 && f[t.offset(ic) + 2] == 0x403001);
  // Many stacks, each found again by its frames (the recent-stack cache and the map agree).
  std::mt19937_64 rng(1);
  std::map<std::vector<uint64_t>, uint32_t> seen;
  for (int i = 0; i < 20000; i++) {
    std::vector<uint64_t> s(1 + rng() % 6);
    for (auto& x : s) x = 0x400000 + (rng() % 64) * 16;
    const uint32_t id = t.intern(s.data(), uint32_t(s.size()));
    auto it = seen.find(s);
    if (it == seen.end())
      seen[s] = id;
    else
      CHECK(it->second == id);
  }
  CHECK(t.size() == 4 + seen.size());  // (the random frames lie below a, b and c's)
}

static void live_map() {
  LiveMap m;
  std::map<uint64_t, uint64_t> truth;
  std::mt19937_64 rng(2);
  for (int i = 0; i < 300000; i++) {  // past the growths at 32 Ki and 64 Ki entries
    // Scattered keys, and dense runs as pymalloc's pools hand out (adjacent 16-byte blocks).
    const uint64_t key = i & 1 ? 16 + (rng() % 200000) * 16
                               : (uint64_t(1 + rng() % 64) << 20) + (rng() % 4096) * 16;
    bool inserted;
    if (rng() % 3) {
      LiveMap::Block* b = m.insert(key, &inserted);
      CHECK(inserted == !truth.count(key));
      b->size = key / 16;
      truth[key] = key / 16;
    } else if (LiveMap::Block* b = m.find(key)) {
      CHECK(truth.count(key) && b->size == truth[key]);
      m.erase(b);
      truth.erase(key);
    } else {
      CHECK(!truth.count(key));
    }
    if (i % 20000 == 0) {  // also while a growth's entries are still moving (two tables)
      size_t listed = 0;
      for (const LiveMap::Block& b : m.entries())
        if (b.key) listed += truth.count(b.key) && truth[b.key] == b.size;
      CHECK(listed == truth.size() && m.size() == truth.size());
    }
  }
  CHECK(m.size() == truth.size());
  size_t found = 0;
  for (auto& [key, size] : truth) {
    const LiveMap::Block* b = m.find(key);
    found += b && b->size == size;
  }
  CHECK(found == truth.size());
}

// Each stack's histogram as a dense one counts it: stacks of one bucket, of a few, and of many
// (moved into a dense row, some before others, while every stack keeps counting), large counts.
static void sparse_histograms() {
  SparseHistograms h;
  std::mt19937_64 rng(3);
  const size_t stacks = 3000;
  std::vector<uint64_t> truth(stacks * kBuckets, 0);
  h.resize(stacks);
  for (int i = 0; i < 400000; i++) {
    const size_t stack = rng() % stacks;
    const int spread = stack % 3 == 0 ? 1 : stack % 3 == 1 ? SparseHistograms::kInline : kBuckets;
    const int bucket = int((stack * 7 + rng() % spread) % kBuckets);
    h.add(stack, bucket);
    truth[stack * kBuckets + bucket]++;
  }
  for (int i = 0; i < 100000; i++) h.add(5, 47), truth[5 * kBuckets + 47]++;  // (bucket 47)
  // Read back as the consumer hands them out (sparse()), spread into dense rows.
  auto dense_of = [&h](size_t n) {
    std::vector<uint64_t> at, count, dense(n * kBuckets, 0);
    h.sparse(n, at, count);
    bool once = at.size() == count.size();
    for (size_t i = 0; i < at.size() && once; i++) {
      once = at[i] < dense.size() && !dense[at[i]] && count[i];  // (each count once, non-zero)
      if (once) dense[at[i]] = count[i];
    }
    return once ? dense : std::vector<uint64_t>();
  };
  const std::vector<uint64_t> dense = dense_of(stacks);
  CHECK(dense == truth);
  size_t same = 0;
  for (size_t k = 0; k < stacks; k++)
    for (int b = 0; b < kBuckets; b++) same += dense[k * kBuckets + b] == truth[k * kBuckets + b];
  CHECK(same == stacks * kBuckets);
  CHECK(h.spilled() == stacks / 3);  // only the stacks of many buckets took a dense row
  h.resize(stacks + 10);  // new stacks empty
  const std::vector<uint64_t> grown = dense_of(stacks + 10);
  CHECK(grown.size() == (stacks + 10) * kBuckets && grown[(stacks + 9) * kBuckets] == 0 &&
        grown[stacks * kBuckets + 47] == 0);
}

// Events between two anchors are timed by their place among the bytes written between them;
// a writer that kept its busy pace has no idle time to hide, one that wrote slowly does.
static void event_times() {
  const uint64_t cap = 4096;
  std::vector<uint64_t> ring(cap / 8, 0);
  // A clock record at cursor 0 (t = 1000), then frees up to cursor 1024, then another clock
  // record at 1024 (t = 2000), then frees up to 2048.
  auto put_time = [&](uint64_t at, uint64_t t) {
    ring[at / 8] = header(kTime, 0, 0, 0);
    ring[at / 8 + 1] = t;
  };
  for (uint64_t at = 0; at < 2048; at += 16) {
    ring[at / 8] = header(kFree, 1, 0, 0);
    ring[at / 8 + 1] = 0x1000 + at;
  }
  put_time(0, 1000);
  put_time(1024, 2000);
  RingClock rc;
  rc.anchor_w = 0;
  rc.anchor_t = 900;
  rc.anchored = true;
  EventTimes et;
  EventTimes::Found found;
  et.begin(rc, found, (const uint8_t*)ring.data(), cap, 0, 2048, 3000);
  uint64_t ts, unc;
  et.time_of(rc, 512, &ts, &unc);  // halfway between the records at 0 and 1024
  CHECK(ts == 1500);
  et.time_of(rc, 1536, &ts, &unc);  // halfway between 1024 and the drain's look at 2048
  CHECK(ts == 2500);
  // No pace known yet (fewer than kMinPaces windows): the whole window is uncertain.
  CHECK(unc == 1000);
  // The next look at the ring (the drain went round again: the first 1040 bytes applied, the
  // writer at 3072 with a clock record at 2048) reads only the new headers, and times as a
  // first look from 1040 would.
  for (uint64_t at = 2048; at < 3072; at += 16) {
    ring[at / 8] = header(kFree, 1, 0, 0);
    ring[at / 8 + 1] = 0x1000 + at;
  }
  put_time(2048, 3500);
  CHECK(found.valid && found.to == 2048 && found.anchors.size() == 2);
  RingClock again = rc, fresh = rc;
  EventTimes::Found none;
  EventTimes et2, et3;
  et2.begin(again, found, (const uint8_t*)ring.data(), cap, 1040, 3072, 4000);
  et3.begin(fresh, none, (const uint8_t*)ring.data(), cap, 1040, 3072, 4000);
  CHECK(found.to == 3072 && found.from == 1040 && found.anchors.size() == 1);  // 1024's dropped
  CHECK(found.anchors[0].w == 2048 && none.anchors.size() == 1);
  for (uint64_t c = 1040; c < 3072; c += 16) {
    uint64_t t2, u2, t3, u3;
    et2.time_of(again, c, &t2, &u2);
    et3.time_of(fresh, c, &t3, &u3);
    CHECK(t2 == t3 && u2 == u3);
  }
  // Each header is read once: a clock record written (forged) since into bytes already read
  // is not seen by the next look, where reading from the cursor again (what made the final
  // drain take its 2 s bound) would find it.
  put_time(1536, 9999);
  EventTimes et4;
  RingClock later = rc;
  et4.begin(later, found, (const uint8_t*)ring.data(), cap, 1040, 3072, 4000);
  CHECK(found.anchors.size() == 1 && found.anchors[0].w == 2048);
  // A cursor that jumped back (forged): read afresh.
  et2.begin(again, found, (const uint8_t*)ring.data(), cap, 0, 1024, 5000);
  CHECK(found.from == 0 && found.to == 1024 && found.anchors.size() == 1);
  // A writer seen busy for many windows: a window written at that pace has no idle time.
  RingClock busy;
  busy.anchored = true;
  EventTimes bt;
  for (uint32_t k = 0; k < kMinPaces + 2; k++) bt.advance(busy, {2048 * (k + 1), 2000 * (k + 1)});
  CHECK(busy.peak_rate > 1.0239 && busy.peak_rate < 1.0241);  // 2048 bytes per 2000 ticks
  // The ring of frees above, written once at that pace and once 5x slower: in the busy window
  // the event's time is exact, in the slow one it may be off by the 8000 ticks not needed.
  const uint64_t t0 = busy.anchor_t, w0 = busy.anchor_w;
  for (uint64_t at = 0; at < 2048; at += 16) {
    ring[at / 8] = header(kFree, 1, 0, 0);
    ring[at / 8 + 1] = 0x1000 + at;
  }
  RingClock fast = busy, slow = busy;
  fast.anchor_w = slow.anchor_w = w0 % cap == 0 ? 0 : w0;
  EventTimes ft, st;
  EventTimes::Found ff, sf;
  ft.begin(fast, ff, (const uint8_t*)ring.data(), cap, 0, 2048, t0 + 2000);
  ft.time_of(fast, 1024, &ts, &unc);
  CHECK(ts == t0 + 1000 && unc == 0);
  st.begin(slow, sf, (const uint8_t*)ring.data(), cap, 0, 2048, t0 + 10000);
  st.time_of(slow, 1024, &ts, &unc);
  CHECK(ts == t0 + 5000 && unc == 8000);
  busy.new_writer();
  CHECK(busy.peak_rate == 0 && busy.npaces == 0);
}

// arch.h: the folder is this processor's (its e_machine is this program's own), the cycle
// counter moves forward and with time, the countdown and the slot relocations answer as the
// hooks rely on.
static void arch_parts() {
  FILE* f = fopen("/proc/self/exe", "rb");
  unsigned char ehdr[20] = {};
  CHECK(f && fread(ehdr, 1, sizeof ehdr, f) == sizeof ehdr);
  if (f) fclose(f);
  CHECK(ehdr[18] + 256 * ehdr[19] == arch::kElfMachine);
  uint64_t prev = arch::cycles();
  bool forward = true;
  for (int i = 0; i < 10000; i++) {
    const uint64_t t = i & 1 ? arch::cycles() : arch::cycles_ordered();
    forward &= t >= prev;
    prev = t;
  }
  CHECK(forward);
  const uint64_t before = arch::cycles_ordered();
  const timespec pause{0, 5000000};
  nanosleep(&pause, nullptr);
  CHECK(arch::cycles_ordered() > before);  // (advances while the thread sleeps)
  int64_t left = 100;
  CHECK(arch::count_down(left, 60) && left == 40);
  CHECK(!arch::count_down(left, 40) && left == 0);
  CHECK(!arch::count_down(left, 1) && left == -1);
  for (const arch::SlotRelocation& r : arch::kSlotRelocations) {
    CHECK(arch::slot_relocation(arch::kSlotRelocations, r.type, 0));
    CHECK(arch::slot_relocation(arch::kSlotRelocations, r.type, 8) == !r.zero_addend);
  }
  CHECK(!arch::slot_relocation(arch::kSlotRelocations, 0, 0));  // (R_*_NONE)
  bool avx512 = true;
  CHECK(arch::cpu_supported(&avx512));
}

// A return address as a frame record holds it: signed where the build and the processor have
// pointer authentication (AArch64's -mbranch-protection, qemu's "max" CPU), then stripped by
// arch::return_address to where the call returns. (Printed: whether it was signed at all.)
__attribute__((noinline)) uint64_t stored_return_address() {
  asm volatile("" ::: "memory");
  return ((uint64_t*)__builtin_frame_address(0))[1];
}
__attribute__((noinline)) void return_addresses() {
  uint64_t stored = stored_return_address();
  const uint64_t here = (uint64_t)&&after;  // the call returns just before this label
after:
  const uint64_t ret = arch::return_address(stored);
  CHECK(ret <= here && here - ret < 64);
  CHECK(arch::return_address(ret) == ret);
  printf("signed %d\n", stored != ret);
}

int main() {
  arch_parts();
  return_addresses();
  stack_table();
  live_map();
  sparse_histograms();
  event_times();
  printf("checks %d failed %d\n", g_checks, g_failed);
  return g_failed != 0;
}
