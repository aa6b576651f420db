// A code object's record (CodeRecord, segment.h): its qualified name, file name, first line and
// line table, copied into the code area the first time a hook meets it, so that the report
// names its frames offline, even once the code object is gone. Copied as CPython keeps them
// (a string's characters in its own width, the line table in its own version's format),
// without calling into the interpreter.
//
// Which code objects have a record: a table of (address, fingerprint) -> record. A code object
// freed and another made at its address has another constants tuple, so another fingerprint,
// and gets its own record. Threads race only to write a record twice.
#pragma once

namespace {

uint8_t* g_code_area;  // Control::python_bytes long
uint64_t g_code_bytes;
RingPython* g_ring_python;  // one per ring (segment.h): the code caches, the recent frames
// Bumped when a code object is freed (python_allocator.h sees it go): every ring's cache
// entries made before then no longer count.
uint64_t g_code_epoch;
bool g_code_frees_seen;  // PyObject_Free's calls reach the hooks: a freed code object is seen

constexpr uint32_t kCodeSeenBits = 14;
constexpr uint64_t kCodeGone = 1;  // a table entry whose code object was freed (probes go on)
struct CodeSeen {
  uint64_t code, value;  // value: fingerprint << 32 | record number
};
alignas(4096) CodeSeen g_code_seen[1u << kCodeSeenBits];  // (emptied by memhook_start)

// A string's characters as CPython keeps them (compact strings only: a code object's are).
struct Chars {
  const uint8_t* at;
  uint32_t bytes;
  uint8_t kind;  // bytes per character
};
inline Chars chars_of(const PythonLayout& l, uint64_t s) {
  if (!plausible(s) || field<uint64_t>(s, 8) != l.unicode_type) return {nullptr, 0, 1};
  const uint32_t state = field<uint32_t>(s, l.str_state);
  // state: interned (2 bits), kind (3), compact, ascii: the same bits in 3.8 to 3.13.
  const uint8_t kind = (state >> 2) & 7;
  if (!(state & 32) || (kind != 1 && kind != 2 && kind != 4)) return {nullptr, 0, 1};
  const uint64_t length = field<uint64_t>(s, l.str_length);
  const uint64_t bytes = length * kind;
  return {(const uint8_t*)(s + ((state & 64) ? l.str_ascii_data : l.str_compact_data)),
          uint32_t(bytes < kMaxCodeString ? bytes : kMaxCodeString / kind * kind), kind};
}

inline uint32_t align8(uint32_t n) { return (n + 7) & ~7u; }

// Writes the record of `code`; returns its number (offset / 8 + 1), or 0 when the area is full.
__attribute__((noinline)) uint32_t write_code_record(const PythonLayout& l, uint64_t code) {
  const Chars name = chars_of(l, field<uint64_t>(code, l.code_name));
  const Chars file = chars_of(l, field<uint64_t>(code, l.code_filename));
  const uint64_t table = field<uint64_t>(code, l.code_linetable);
  uint64_t table_bytes = 0;
  if (plausible(table) && field<uint64_t>(table, 8) == l.bytes_type)
    table_bytes = field<uint64_t>(table, l.bytes_size);
  const bool cut = table_bytes > kMaxCodeTable;
  if (cut) table_bytes = kMaxCodeTable;
  const uint32_t bytes = align8(uint32_t(sizeof(CodeRecord)) + name.bytes + file.bytes +
                                uint32_t(table_bytes));
  Control* c = g_ctl;
  const uint64_t at = __atomic_fetch_add(&c->python_used, bytes, __ATOMIC_RELAXED);
  if (at + bytes > g_code_bytes) {
    __atomic_fetch_add(&c->python_unrecorded, 1, __ATOMIC_RELAXED);
    return 0;
  }
  uint8_t* p = g_code_area + at;
  CodeRecord* r = (CodeRecord*)p;
  r->flags = cut ? kCodeTableCut : 0;
  r->code = code;
  r->firstlineno = field<int32_t>(code, l.code_firstlineno);
  r->name_kind = name.kind;
  r->file_kind = file.kind;
  r->minor = (uint8_t)l.minor;
  r->name_bytes = name.bytes;
  r->file_bytes = file.bytes;
  r->table_bytes = uint32_t(table_bytes);
  uint8_t* o = p + sizeof(CodeRecord);
  memcpy(o, name.at, name.bytes);
  memcpy(o + name.bytes, file.at, file.bytes);
  if (table_bytes) memcpy(o + name.bytes + file.bytes, (const void*)(table + l.bytes_data), table_bytes);
  __atomic_store_n(&r->bytes, bytes, __ATOMIC_RELEASE);
  return uint32_t(at / 8 + 1);
}

// The record number of `code`, written now if it has none. Its fingerprint is its constants
// tuple's address, read from the line its type was just read from (a code object made by
// replace() from another shares its constants: at the same address as that one once was,
// it would read as that one).
inline uint32_t code_record(const PythonLayout& l, uint64_t code) {
  const uint64_t fp = uint32_t((field<uint64_t>(code, l.code_consts) >> 4) *
                               0x9E3779B97F4A7C15ull >> 32);
  const uint32_t mask = (1u << kCodeSeenBits) - 1;
  const uint32_t home = uint32_t((code * 0x9E3779B97F4A7C15ull) >> (64 - kCodeSeenBits));
  uint32_t slot = home;  // where the record goes: this code's entry, the first free, or home
  bool free_found = false;
  for (uint32_t i = 0; i < 8; i++) {
    const uint32_t at = (home + i) & mask;
    CodeSeen& e = g_code_seen[at];
    const uint64_t k = __atomic_load_n(&e.code, __ATOMIC_ACQUIRE);
    if (k == code) {
      const uint64_t v = __atomic_load_n(&e.value, __ATOMIC_RELAXED);
      if (v >> 32 == fp && uint32_t(v)) return uint32_t(v);
      slot = at;  // another code object once at this address
      break;
    }
    if ((!k || k == kCodeGone) && !free_found) {
      slot = at;
      free_found = true;
    }
    if (!k) break;
  }
  const uint32_t record = write_code_record(l, code);
  if (!record) return 0;
  CodeSeen& e = g_code_seen[slot];
  __atomic_store_n(&e.code, kCodeGone, __ATOMIC_RELAXED);  // (a probe passes it meanwhile)
  __atomic_store_n(&e.value, fp << 32 | record, __ATOMIC_RELAXED);
  __atomic_store_n(&e.code, code, __ATOMIC_RELEASE);
  return record;
}

// A code object is being freed (PyObject_Free, python_allocator.h): its table entry goes, and
// every ring's cache with it.
__attribute__((noinline)) void forget_code(uint64_t code) {
  const uint32_t mask = (1u << kCodeSeenBits) - 1;
  const uint32_t home = uint32_t((code * 0x9E3779B97F4A7C15ull) >> (64 - kCodeSeenBits));
  for (uint32_t i = 0; i < 8; i++) {
    CodeSeen& e = g_code_seen[(home + i) & mask];
    const uint64_t k = __atomic_load_n(&e.code, __ATOMIC_RELAXED);
    if (!k) break;
    if (k == code) __atomic_store_n(&e.code, kCodeGone, __ATOMIC_RELEASE);
  }
  __atomic_fetch_add(&g_code_epoch, 1, __ATOMIC_RELEASE);
}

// What the walk needs of `code` (its record, its first traceable instruction), from the ring's
// cache, else read and kept there. False: not a code object.
struct CodeFacts {
  uint32_t record;
  int32_t firsttraceable;
};
inline bool code_facts(const PythonLayout& l, const ThreadState& t, uint64_t code, CodeFacts* out) {
  CodeCacheEntry* e = &g_ring_python[t.ring_no - 1].cache[(code >> 4) & (kCodeCacheEntries - 1)];
  const uint64_t epoch = __atomic_load_n(&g_code_epoch, __ATOMIC_ACQUIRE);
  // A hit reads nothing of the code object: none was freed since the entry was made, so the
  // one at this address is still the one read then (where frees are not seen, its constants'
  // address tells, as the table's fingerprint does).
  if (e->code == code && e->epoch == epoch &&
      (g_code_frees_seen || field<uint64_t>(code, l.code_consts) == e->consts)) {
    *out = {e->record, e->firsttraceable};
    return true;
  }
  if (!plausible(code) || field<uint64_t>(code, 8) != l.code_type) return false;  // (ob_type)
  out->record = code_record(l, code);
  out->firsttraceable = l.code_firsttraceable >= 0 ? field<int32_t>(code, l.code_firsttraceable)
                                                   : -1;
  if (out->record) *e = {code, epoch, field<uint64_t>(code, l.code_consts), out->record,
                          out->firsttraceable};
  return true;
}

}  // namespace
