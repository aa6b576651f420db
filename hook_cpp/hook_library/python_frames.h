// Python frames: the calling thread's own interpreter frames, appended to an allocation's native
// frames (record_format.h says how), so that the report can say which Python function ran where
// _PyEval_EvalFrameDefault did.
//
// Read from the thread itself, between two of its own calls, where CPython keeps them (the layout
// memhook found for the target's version: Control::python): a thread's chain of frames is whole
// whenever it calls out, and only that thread changes it, so no GIL is needed. Nothing in the
// interpreter is called but PyGILState_GetThisThreadState (a thread-specific read) and nothing
// is allocated. A code object is named once: the first time it is seen its names and line table
// are copied into the code area (code_records.h), and frames carry its record's number.
#pragma once

namespace {

const PythonLayout* g_python;  // null: no interpreter, or memhook found no layout for it

template <class T>
inline T field(uint64_t object, int32_t offset) {
  return *(const T*)(object + offset);
}
// A pointer CPython could have made: in user space, aligned. (A frame chain is whole when its
// thread reads it; this stops a walk at anything else rather than following it.)
inline bool plausible(uint64_t p) {
  return p >= 4096 && p < (uint64_t(1) << arch::kUserAddressBits) && !(p & 7);
}

#include "code_records.h"  // a code object's record, written once

// The byte offset of the instruction frame `f` of `code` was at; negative before its first.
inline int64_t instruction_offset(const PythonLayout& l, uint64_t f, uint64_t code) {
  switch (l.instr_kind) {
    case kInstrLastiBytes: return field<int32_t>(f, l.frame_instr);
    case kInstrLastiUnits: return int64_t(field<int32_t>(f, l.frame_instr)) * 2;
    default: return int64_t(field<uint64_t>(f, l.frame_instr) - (code + l.code_units));
  }
}

// The calling thread's Python frames, innermost first, into out[0, room). Returns how many, and
// in *hash the words hashed into it (python_stack_words' key) as they are found: the multiplies
// run while the walk waits for each frame's load, where a loop after it took 14 % of the hook
// library's time in a Python program's imports. A word is hashed once the next one is out (a
// run's entry flag may still be set on the latest).
constexpr uint64_t kWordHash = 0x9E3779B97F4A7C15ull;
__attribute__((noinline)) uint32_t python_frames(const ThreadState& t, uint64_t* out,
                                                 uint32_t room, uint64_t* hash) {
  const PythonLayout& l = *g_python;
  if (!room) return 0;
  const uint64_t ts = (uint64_t)((void* (*)())l.this_thread_state)();
  if (!plausible(ts)) return 0;  // a thread the interpreter does not know
  uint64_t f = field<uint64_t>(ts, l.tstate_frame);
  if (l.cframe_current >= 0 && f) f = plausible(f) ? field<uint64_t>(f, l.cframe_current) : 1;
  uint32_t n = 0;
  uint64_t h = *hash;
  const auto emit = [&](uint64_t word) {
    if (n) h = (h ^ out[n - 1]) * kWordHash;
    out[n++] = word;
  };
  bool run_open = false;  // out[n - 1] is the innermost frame of a run whose first is not yet out
  for (uint32_t steps = 0; f && steps < 4 * kPythonDepth; steps++) {
    if (!plausible(f)) {
      if (n < room) emit(kPythonUnreadable);
      break;
    }
    const uint64_t prev = field<uint64_t>(f, l.frame_previous);
    const int owner = l.frame_owner >= 0 ? field<uint8_t>(f, l.frame_owner) : -1;
    if (owner == l.owner_cstack) {  // a shim: the run inside it began at the frame before
      if (run_open) out[n - 1] |= kPythonEntry;
      run_open = false;
      f = prev;
      continue;
    }
    const uint64_t code = field<uint64_t>(f, l.frame_code);
    CodeFacts facts;
    if (!code_facts(l, t, code, &facts)) {
      if (n < room) emit(kPythonUnreadable);
      break;
    }
    const int64_t at = instruction_offset(l, f, code);
    const bool first = l.run_kind == kRunEachFrame ||
                       (l.run_kind == kRunFlag && field<uint8_t>(f, l.frame_is_entry)) ||
                       (l.run_kind == kRunAfterShim && !prev);
    // Incomplete: not yet at its first traceable instruction (CPython leaves it out of every
    // traceback); a run it began ends at the frame before.
    if (facts.firsttraceable >= 0 && owner != l.owner_generator &&
        at < int64_t(facts.firsttraceable) * 2) {
      if (first && run_open) out[n - 1] |= kPythonEntry;
      if (first) run_open = false;
      f = prev;
      continue;
    }
    if (n == room) break;
    emit(kPythonFrame | (first ? kPythonEntry : 0) | uint64_t(facts.record) << kPythonCodeShift |
         uint32_t(at < 0 ? 0 : at > 0xfffffffe ? 0xfffffffe : at));
    run_open = !first;
    f = prev;
  }
  if (n) h = (h ^ out[n - 1]) * kWordHash;
  *hash = h;
  return n;
}

}  // namespace
