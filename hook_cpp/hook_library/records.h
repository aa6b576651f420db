// The record writers: an allocation's, a free's and a realloc's words in the ring (the grammar
// is segment.h's), with the dependency the address table gives each.
#pragma once

namespace {

// A pointer word: the pointer, and in its top bits how far `frame` lies below the top of this
// thread's stack (in 16-byte units; 0: unknown, as for a frame of 0 or off the stack), which is
// all the consumer compares frames by.
inline uint64_t with_depth(ThreadState& t, uint64_t ptr, uint64_t frame) {
  uint64_t depth = (t.stack_hi - frame) >> 4;
  return (ptr & kPtrMask) | (depth < (uint64_t(1) << (64 - kPtrBits)) ? depth << kPtrBits : 0);
}

// An allocation record's pointer word, size word and frames (none when a recent stack matches).
struct StackWords {
  uint64_t ptr, size;
  uint32_t nframes;
};

// In a Python process: the thread's Python frames are read first, and pick the recent stack
// with the call site (many Python stacks allocate from one native place: each keeps its own
// entry), which repeats only with the same ones (RingPython::recent). Its entry is never the
// malloc hook's to compare (frame_walk.h: the hook by hand reads no Python frame).
__attribute__((noinline)) StackWords python_stack_words(ThreadState& t, Origin from, uint64_t p,
                                                        uint64_t size, uint64_t* frames,
                                                        uint64_t ret0) {
  uint64_t words[kPythonDepth];
  uint64_t h = ret0 ^ (uint64_t)from.ret;
  const uint32_t k = python_frames(t, words, g_record_frames - g_depth, &h);
  constexpr int bits = __builtin_ctz(kRecentStacks);
  const uint32_t i = uint32_t(h >> (64 - bits));
  RecentStack* c = recent_stack_at(t, i);
  t.last_recent = c;
  RingPython::Frames& kept = g_ring_python[t.ring_no - 1].recent[i];
  if (same_stack(c, from, ret0) && kept.n == k &&
      __builtin_memcmp(kept.words, words, 8 * size_t(k)) == 0)
    return {p & kPtrMask, size | c->size_bits, 0};
  uint64_t caller;
  const uint32_t n = backtrace(t, from, ret0, frames, &caller, c);
  __builtin_memcpy(frames + n, words, 8 * size_t(k));
  if (!c->ret0) return {with_depth(t, p, caller), size, n + k};  // a walk not kept
  kept.n = k;
  __builtin_memcpy(kept.words, words, 8 * size_t(k));
  c->size_bits = uint64_t(i + 1) << kRecentShift;
  return {with_depth(t, p, caller), size | c->size_bits, n + k};
}

// The entry the call picks missed: another of its set, or a walk (out of line, so that the
// common case keeps few registers).
__attribute__((noinline)) StackWords stack_words_missed(ThreadState& t, Origin from, uint64_t p,
                                                        uint64_t size, uint64_t* frames) {
  const uint64_t ret0 = (uint64_t)*from.ret;  // (six arguments: all in registers)
  uint32_t i, k;
  recent_stack_for(t, ret0, from, &i);
  if (RecentStack* o = same_stack_in_set(t, i, from, ret0, &k)) {  // kept in another of its set
    t.last_recent = o;
    return {p & kPtrMask, size | o->size_bits, 0};
  }
  i = recent_stack_to_fill(t, i);
  RecentStack* c = recent_stack_at(t, i);
  t.last_recent = c;  // a stack just walked
  uint64_t caller;
  const uint32_t n = backtrace(t, from, ret0, frames, &caller, c);
  if (!c->ret0) return {with_depth(t, p, caller), size, n};  // a walk not kept
  c->size_bits = uint64_t(i + 1) << kRecentShift;
  return {with_depth(t, p, caller), size | c->size_bits, n};
}

__attribute__((always_inline)) inline StackWords stack_words(ThreadState& t, Origin from,
                                                             uint64_t p, uint64_t size,
                                                             uint64_t* frames) {
  const uint64_t ret0 = (uint64_t)*from.ret;
  size &= kSizeMask;
  if (g_python) return python_stack_words(t, from, p, size, frames, ret0);
  uint32_t i;
  RecentStack* c = recent_stack_for(t, ret0, from, &i);
  t.last_recent = c;  // a stack just seen
  if (same_stack(c, from, ret0))  // the recent stack again: no frames
    return {p & kPtrMask, size | c->size_bits, 0};  // its depth is the recent stack's (segment.h)
  return stack_words_missed(t, from, p, size, frames);
}

// The record of an allocation that returned `p`, at `at` (cursor w). Returns its words.
__attribute__((always_inline)) inline size_t write_alloc(ThreadState& t, uint64_t* at,
                                                         uint64_t w, int op, void* p,
                                                         uint64_t size, Origin from) {
  const uint64_t dep = table_swap(t, (uint64_t)p, kLive, w);
  const StackWords s = stack_words(t, from, (uint64_t)p, size, at + 3);
  at[1] = s.ptr;
  at[2] = s.size;
  at[0] = header(kAlloc, op, s.nframes, dep);
  return 3 + s.nframes;
}

__attribute__((noinline)) void record_alloc_slow(ThreadState& t, int op, void* p, uint64_t size,
                                                 Origin from) {
  uint64_t w;
  if (!event_ring(t)) return;
  if (!reserve(t, 8 * (3 + g_record_frames), &w)) return drop(t.ring);
  publish(t, w + 8 * write_alloc(t, record_at(t, w), w, op, p, size, from));
}

// An allocation that returned `p`, recorded after the real call (the guard set).
__attribute__((always_inline)) inline void record_alloc(ThreadState& t, int op, void* p,
                                                        uint64_t size, Origin from) {
  const uint64_t w = t.write;
  if (!fast_room(t, w, 8 * (3 + g_record_frames))) return record_alloc_slow(t, op, p, size, from);
  publish(t, w + 8 * write_alloc(t, record_at(t, w), w, op, p, size, from));
}

__attribute__((noinline)) void* record_alloc_slow_leave(ThreadState& t, int op, void* p,
                                                        uint64_t size, Origin from) {
  record_alloc_slow(t, op, p, size, from);
  leave(t);
  return p;
}

// Full tracing's record of an allocation: out of line, so that the hook around the real call
// keeps few registers, and a leaf on its common path (the slow path a tail call), so that it
// saves few itself (two, where the record inlined into the hook made it save six). Sets and
// clears the guard. Returns `p`, so that an entry can tail-call it.
template <int Op>
__attribute__((always_inline)) inline void* record_alloc_leaf(void* p, uint64_t size,
                                                             Origin from) {
  ThreadState& t = t_state;
  enter(t);
  const uint64_t w = t.write;
  if (!fast_room(t, w, 8 * (3 + g_record_frames))) return record_alloc_slow_leave(t, Op, p, size, from);
  publish(t, w + 8 * write_alloc(t, record_at(t, w), w, Op, p, size, from));
  leave(t);
  return p;
}

template <int Op>
__attribute__((noinline, optimize("omit-frame-pointer"))) void record_alloc_now(void* p,
                                                                               uint64_t size,
                                                                               Origin from) {
  record_alloc_leaf<Op>(p, size, from);
}

inline void write_free(ThreadState& t, uint64_t* at, uint64_t w, int op, void* p, HookFrame fp) {
  at[0] = header(kFree, op, 0, table_swap(t, (uint64_t)p, 0, w));
  at[1] = with_depth(t, (uint64_t)p, arch::frame_base(fp));
}

__attribute__((noinline)) void record_free_slow(ThreadState& t, int op, void* p, HookFrame fp) {
  uint64_t w;
  if (!event_ring(t, true)) return table_set_live((uint64_t)p, false);
  if (!reserve(t, 16, &w, true)) {
    table_set_live((uint64_t)p, false);
    return drop_free(t.ring);
  }
  write_free(t, record_at(t, w), w, op, p, fp);
  publish(t, w + 16);
}

// A free, recorded (and published) before the real call (the guard set): once it returns,
// another thread may get the block back, and that thread's event will depend on this one.
__attribute__((always_inline)) inline void record_free(ThreadState& t, int op, void* p,
                                                       HookFrame fp) {
  const uint64_t w = t.write;
  if (!fast_room(t, w, 16, true)) return record_free_slow(t, op, p, fp);
  write_free(t, record_at(t, w), w, op, p, fp);
  publish(t, w + 16);
}

// A range unmapped (munmap, mremap's old range) or released (madvise): recorded before the
// real call, as a free is, so that a mapping another thread then gets at that address comes
// after it. `table`: the address table orders it against that thread's record (unmaps).
__attribute__((noinline)) void record_unmap(ThreadState& t, int op, void* p, uint64_t len,
                                            HookFrame fp, bool table) {
  uint64_t w;
  if (!event_ring(t, true)) return;
  if (!reserve(t, 24, &w, true)) return drop_free(t.ring);
  uint64_t* at = record_at(t, w);
  at[0] = header(kUnmap, op, 0, table ? table_swap(t, (uint64_t)p, 0, w) : 0);
  at[1] = with_depth(t, (uint64_t)p, arch::frame_base(fp));
  at[2] = len & kSizeMask;
  publish(t, w + 24);
}

// A realloc no record is written for: `old` is marked freed in the address table before the
// call (another thread may get the block back once it starts) and live again if it failed.
template <class Call>
void* realloc_unrecorded(void* old, uint64_t size, bool track_old, Call call) {
  if (track_old) table_set_live((uint64_t)old, false);
  void* p = call();
  if (track_old && !p && size) table_set_live((uint64_t)old, true);
  return p;
}

// realloc-like: `old` stops being ours when the call starts, the result is ours when it returns,
// so the record is reserved and `old` entered in the table before the call, and published after.
// Always one counted event: the dependency written for `old` names it. `call` makes the real
// call; it may set `size` (an in-place resize learns the size it got from the call).
template <class Call>
void* record_realloc(ThreadState& t, int op, void* old, uint64_t& size, bool track_old,
                     bool track_new, HookFrame fp, Call call) {
  if (!event_ring(t, track_old)) return realloc_unrecorded(old, size, track_old, call);
  RingHeader* r = t.ring;
  __atomic_store_n(&r->busy, 1, __ATOMIC_RELAXED);
  uint64_t w;
  if (!reserve(t, 8 * (5 + g_record_frames), &w)) {
    // No room for an allocation: the new block goes unrecorded, but the free of `old` is
    // recorded all the same in a free's room, unless even that is full.
    if (!track_old || !reserve(t, 16, &w, true)) {
      track_old ? drop_free(r) : drop(r);
      void* p = realloc_unrecorded(old, size, track_old, call);
      end_busy(r);
      return p;
    }
    drop(r);
    track_new = false;
  }
  uint64_t* at = record_at(t, w);
  uint64_t dep_old = track_old ? table_swap(t, (uint64_t)old, 0, w) : 0;
  void* p = call();
  // Failure leaves `old` untouched (still live); a zero size frees it, as glibc does.
  bool old_freed = track_old && (p || size == 0);
  if (track_old && !old_freed) table_swap(t, (uint64_t)old, kLive, w);
  if (g_sample_rate) {  // raise before lowering: an in-place realloc's counter never reads 0
    if (p && track_new) count_sampled((uint64_t)p, +1);
    if (old_freed) count_sampled((uint64_t)old, -1);
  }
  size_t words = 1;
  if (p && track_new) {
    size_t head = old_freed ? 5 : 3;
    const StackWords s = stack_words(t, origin_of(fp), (uint64_t)p, size, at + head);
    at[0] = header(old_freed ? kRealloc : kAlloc, op, s.nframes,
                   table_swap(t, (uint64_t)p, kLive, w));
    at[1] = s.ptr;
    at[2] = s.size;
    if (old_freed) {
      at[3] = (uint64_t)old;
      at[4] = dep_old;
    }
    words = head + s.nframes;
  } else if (old_freed) {
    at[0] = header(kFree, op, 0, dep_old);
    at[1] = with_depth(t, (uint64_t)old, arch::frame_base(fp));
    words = 2;
  } else {
    at[0] = header(kNop, op, 0, 0);
  }
  publish(t, w + 8 * words);
  end_busy(r);
  return p;
}

}  // namespace
