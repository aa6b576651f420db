// A full ring: the writer waits for the consumer to make room, at most Control::max_wait_ns
// for one event, rather than drop the event (heapprofd's block_client, bounded). Under
// --lossless every event may wait so; by default a wait that runs out makes the ring drop
// without waiting until the consumer has emptied half of it, so that a burst on an idle host
// loses nothing and a starved consumer costs the target one bounded wait per half ring.
// A stalled consumer is told from a starved one by how often waits outlast the bound: when
// none did, on any thread, for kGraceEveryNs, a wait may last kGraceTimes as long. A consumer
// held off once (its vCPU taken by the host, a CPU hog's scheduler tick: a 10 ms wait ran out
// in 1 burst of 86 beside one hog) then costs one longer wait and no events; a starved one
// outlasts the bound again within that time and drops as before, having cost the target one
// longer wait. (Outlasts, not runs out: a starved consumer that makes room once in every
// longer wait would never run out, and the target would go at its pace.)
// A thread that allocates faster than the consumer applies, for good, is not a burst: it would
// wait at every lap and run at the consumer's pace for as long as it lasts (threads allocating
// at full speed on both cores ran at 0.15-0.35 of it, waiting half their time, and still
// dropped 65 % of their events). By default a thread waits at most one part in kWaitShare of
// its time beyond a credit of kWaitCreditNs (or the longer wait, if longer) that it starts with
// and earns back at that rate: a burst's waits fit in it (a million kept blocks wait some
// 0.1-0.5 s); past it the thread drops until half its ring is emptied, as after a wait that ran
// out.
// Waits are counted per ring, with their time and the ones that ran out.
#pragma once

namespace {

void check_consumer();
void wake_consumer(ThreadState& t, uint64_t w);  // (ring_writer.h)

uint64_t g_max_wait_ns;  // 0: a full ring drops at once
bool g_lossless;
constexpr uint64_t kGraceEveryNs = 10000000000ull, kGraceTimes = 10;
constexpr uint64_t kWaitCreditNs = 1000000000;
constexpr int64_t kWaitShare = 8, kLeastWaitNs = 1000000;  // (no wait shorter than a sleep's cost)
uint64_t g_outlasted_at;  // when a wait last outlasted the bound, on any thread (0: never)

// No wait from now until the consumer has emptied half the ring: the events meanwhile drop.
inline uint64_t drop_until_half_emptied(ThreadState& t, const RingHeader* r) {
  t.wait_again_at = __atomic_load_n(&r->read, __ATOMIC_ACQUIRE) + g_ring_bytes / 2;
  return UINT64_MAX;
}

// Sleeps on the low word of the ring's read cursor, which the consumer wakes when it moves it
// while `waiting` is set (ring_reader.h). Slices of at most 10 ms: the heartbeat is checked
// between them, so that a consumer killed while the writer waits costs the target at most
// max_wait per event until it unhooks itself (lifecycle.h). `end`: the write cursor the event
// needs; `limit`: the bytes this kind of event may fill. Returns the read cursor that makes
// room, or UINT64_MAX (drop the event) when no wait is due, the wait ran out or the session
// ended.
__attribute__((noinline, cold)) uint64_t wait_for_room(ThreadState& t, uint64_t end,
                                                       uint64_t limit) {
  RingHeader* r = t.ring;
  if (!g_max_wait_ns || (!g_lossless && t.cached_read < t.wait_again_at)) return UINT64_MAX;
  const uint64_t t0 = monotonic_ns();
  const uint64_t outlasted_at = __atomic_load_n(&g_outlasted_at, __ATOMIC_RELAXED);
  const bool grace = !g_lossless && (!outlasted_at || t0 - outlasted_at >= kGraceEveryNs);
  const uint64_t longer = min_of<uint64_t>(g_max_wait_ns * kGraceTimes, kMaxWaitNs);
  uint64_t deadline = t0 + (grace ? longer : g_max_wait_ns);
  if (!g_lossless) {
    const int64_t most = int64_t(longer > kWaitCreditNs ? longer : kWaitCreditNs);
    t.wait_credit_ns = t.credit_at
                           ? min_of(most, t.wait_credit_ns + int64_t(t0 - t.credit_at) / kWaitShare)
                           : most;
    t.credit_at = t0;
    // Its credit spent (a wait's sleep ends up to the timer's slack past its deadline: the
    // credit goes below 0 and that is paid back too): drop, as after a wait that ran out.
    if (t.wait_credit_ns < kLeastWaitNs) return drop_until_half_emptied(t, r);
    deadline = min_of(deadline, t0 + uint64_t(t.wait_credit_ns));
  }
  uint64_t rd = UINT64_MAX, now = t0;
  wake_consumer(t, t.write);
  for (;;) {
    __atomic_store_n(&r->waiting, 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  // the consumer's store of `read`, then its look
    const uint64_t seen = __atomic_load_n(&r->read, __ATOMIC_ACQUIRE);
    if (end - seen <= limit) {
      rd = seen;
      break;
    }
    if (now >= deadline || !active() || t.generation != g_session.generation) break;
    const uint64_t slice = min_of<uint64_t>(deadline - now, 10000000);
    struct timespec ts = {0, (long)slice};
    syscall(SYS_futex, (uint32_t*)&r->read, FUTEX_WAIT, (uint32_t)seen, &ts, nullptr, 0);
    now = monotonic_ns();
    check_consumer();  // memhook gone: unhook (active() then says so)
  }
  __atomic_store_n(&r->waiting, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&r->waits, r->waits + 1, __ATOMIC_RELAXED);
  const uint64_t waited = monotonic_ns() - t0;
  if (!g_lossless) t.wait_credit_ns -= int64_t(waited);
  __atomic_store_n(&r->wait_ns, r->wait_ns + waited, __ATOMIC_RELAXED);
  if (waited / 1000 > r->wait_max_us)
    __atomic_store_n(&r->wait_max_us, (uint32_t)min_of<uint64_t>(waited / 1000, UINT32_MAX),
                     __ATOMIC_RELAXED);
  if (rd == UINT64_MAX) {
    __atomic_store_n(&r->wait_timeouts, r->wait_timeouts + 1, __ATOMIC_RELAXED);
    drop_until_half_emptied(t, r);
  }
  if (rd == UINT64_MAX || waited > g_max_wait_ns)
    __atomic_store_n(&g_outlasted_at, t0 + waited, __ATOMIC_RELAXED);
  return rd;
}

}  // namespace
