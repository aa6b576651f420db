// The backtrace: a frame-pointer walk from the allocation's call site, every read checked to lie
// on this thread's stack.
#pragma once

namespace {

// Frame-pointer walk from the call site (ret0, the return address in from.ret). Each frame
// pointer followed must lie above the previous one (the first above the return-address slot)
// and below the top of this thread's stack, so every read stays on the stack between the hook
// and its top: code built without frame pointers ends the walk (or adds a bogus address), never
// faults. A hook off the thread's stack (a signal stack) yields the call site alone. Returns the
// frames written to `out`; *caller: the allocating function's frame base, or 0. A walk that
// could be made is kept in `c`.
inline uint32_t backtrace(ThreadState& t, Origin from, uint64_t ret0, uint64_t* out,
                          uint64_t* caller, RecentStack* c) {
  uint64_t* o = out;
  uint64_t* const end = out + g_depth;
  *o++ = ret0;
  *caller = 0;
  const uintptr_t lo = t.stack_lo, hi = t.stack_hi, top = hi - 16;
  void** f = from.frame;
  if ((uintptr_t)from.ret - lo < hi - lo && (uintptr_t)f > (uintptr_t)from.ret &&
      (uintptr_t)f <= top) {
    *caller = (uint64_t)f;
    RecentStack::Pair* pr = c->pairs;
    while (o < end) {
      const uint64_t next = (uint64_t)f[0], ret = (uint64_t)f[1];
      *o++ = ret;
      *pr++ = {next, ret};
      if (next <= (uintptr_t)f || next > top) break;
      f = (void**)next;
    }
    const uint32_t n = uint32_t(pr - c->pairs);
    c->first = n <= kAlignedPairs ? kAlignedPairs - n : 0;
    if (c->first) memmove(c->pairs + c->first, c->pairs, n * sizeof(RecentStack::Pair));
    c->n = n;
    c->frame = (uint64_t)from.frame;
    c->ret0 = ret0;
    c->compare = compare_entry(n);
  }
  return uint32_t(o - out);
}

}  // namespace
