// CPython's own allocator: most Python objects come from pymalloc's arenas, not from malloc, so
// the hooks on malloc saw 256 KiB arenas where the program made objects. PyObject_Malloc and
// PyMem_Malloc call through an allocator struct (PyMemAllocatorEx: ctx, malloc, calloc,
// realloc, free) whatever inlined them (an LTO build compares the pointer with pymalloc's own
// and runs it inline only while it is unchanged), the struct tracemalloc replaces: its function
// pointers are this session's slots. memhook finds the structs (python_interpreter.py); here
// they get entries that drop the context and jump to the hooks of hooks.def's rows
// (pyobject_malloc ...), whose real functions call the saved originals with their context.
//
// Each pointer is one atomic store and the context is left as it was, so a thread reading the
// struct while it changes calls either the original or the hook, each with the right context.
// Detach puts back every pointer that still holds the entry (tracemalloc started meanwhile
// keeps ours as its original: our entries pass through once inactive, and stay loaded).
#pragma once

namespace {

struct PyAllocator {
  void* ctx;
  void* (*malloc)(void*, size_t);
  void* (*calloc)(void*, size_t, size_t);
  void* (*realloc)(void*, void*, size_t);
  void (*free)(void*, void*);
};
PyAllocator g_py_original[2];  // the MEM and OBJ domains' structs as memhook_patch found them
bool g_py_hooked;              // the entries are in them (until detach or abandon)
enum : int { kPyMem = 0, kPyObj = 1 };

// The real functions of the rows (REAL(pyobject_malloc) ...): domain D's original with its
// context.
template <int D>
void* py_real_malloc(size_t n) { return g_py_original[D].malloc(g_py_original[D].ctx, n); }
template <int D>
void* py_real_calloc(size_t c, size_t n) {
  return g_py_original[D].calloc(g_py_original[D].ctx, c, n);
}
template <int D>
void* py_real_realloc(void* p, size_t n) {
  return g_py_original[D].realloc(g_py_original[D].ctx, p, n);
}
template <int D>
void py_real_free(void* p) { g_py_original[D].free(g_py_original[D].ctx, p); }

// The entries the structs point at: the context dropped, a tail call to the hook the session's
// mode routes to for row `Id` (g_hook_fn), so that the hook's caller is the allocation's own.
template <int Id>
__attribute__((optimize("omit-frame-pointer"))) void* py_entry_malloc(void*, size_t n) {
  return ((void* (*)(size_t))g_hook_fn[Id])(n);
}
template <int Id>
__attribute__((optimize("omit-frame-pointer"))) void* py_entry_calloc(void*, size_t c, size_t n) {
  return ((void* (*)(size_t, size_t))g_hook_fn[Id])(c, n);
}
template <int Id>
__attribute__((optimize("omit-frame-pointer"))) void* py_entry_realloc(void*, void* p, size_t n) {
  return ((void* (*)(void*, size_t))g_hook_fn[Id])(p, n);
}
// Objects (Code): a code object freed keeps its record, but its address may come back as
// another's (code_records.h). Seen before any guard: a collection that a hooked allocation set
// off frees objects inside it. (A code object is no collector's: `p` is the object itself.)
template <int Id, bool Code>
__attribute__((optimize("omit-frame-pointer"))) void py_entry_free(void*, void* p) {
  if (Code && p && g_python && *(const uint64_t*)((const uint8_t*)p + 8) == g_python->code_type)
    forget_code((uint64_t)p);
  ((void (*)(void*))g_hook_fn[Id])(p);
}

const PyAllocator kPyEntries[2] = {
    {nullptr, py_entry_malloc<ID_pymem_malloc>, py_entry_calloc<ID_pymem_calloc>,
     py_entry_realloc<ID_pymem_realloc>, py_entry_free<ID_pymem_free, false>},
    {nullptr, py_entry_malloc<ID_pyobject_malloc>, py_entry_calloc<ID_pyobject_calloc>,
     py_entry_realloc<ID_pyobject_realloc>, py_entry_free<ID_pyobject_free, true>}};

inline void store_pointer(void* at, const void* value) {
  __atomic_store_n((void**)at, (void*)value, __ATOMIC_RELEASE);
}

// memhook_patch: save each struct as it is and point its functions at the entries. A struct
// already holding them (a session before this one left them, tracemalloc aside) keeps its
// saved originals.
void hook_python_allocators(Control* c) {
  const uint64_t at[2] = {c->python.mem_allocator, c->python.obj_allocator};
  if (!at[kPyMem] || !at[kPyObj]) return;
  g_real[ID_pyobject_malloc] = (void*)py_real_malloc<kPyObj>;
  g_real[ID_pyobject_calloc] = (void*)py_real_calloc<kPyObj>;
  g_real[ID_pyobject_realloc] = (void*)py_real_realloc<kPyObj>;
  g_real[ID_pyobject_free] = (void*)py_real_free<kPyObj>;
  g_real[ID_pymem_malloc] = (void*)py_real_malloc<kPyMem>;
  g_real[ID_pymem_calloc] = (void*)py_real_calloc<kPyMem>;
  g_real[ID_pymem_realloc] = (void*)py_real_realloc<kPyMem>;
  g_real[ID_pymem_free] = (void*)py_real_free<kPyMem>;
  for (int d = 0; d < 2; d++) {
    PyAllocator* s = (PyAllocator*)at[d];
    if (s->malloc != kPyEntries[d].malloc) g_py_original[d] = *s;
    if (!g_py_original[d].malloc || !g_py_original[d].calloc || !g_py_original[d].realloc ||
        !g_py_original[d].free)
      return;  // (nothing hooked: a struct half empty is no allocator)
  }
  for (int d = 0; d < 2; d++) {
    PyAllocator* s = (PyAllocator*)at[d];
    store_pointer(&s->malloc, (void*)kPyEntries[d].malloc);
    store_pointer(&s->calloc, (void*)kPyEntries[d].calloc);
    store_pointer(&s->realloc, (void*)kPyEntries[d].realloc);
    store_pointer(&s->free, (void*)kPyEntries[d].free);
  }
  g_py_hooked = true;
  g_code_frees_seen = true;
  c->python.allocators_hooked = 1;  // (for the report: stays set after detach)
}

// Detach and abandon: each pointer that still holds its entry gets its original back.
void unhook_python_allocators(Control* c) {
  if (!g_py_hooked) return;
  g_py_hooked = false;
  g_code_frees_seen = false;
  const uint64_t at[2] = {c->python.mem_allocator, c->python.obj_allocator};
  for (int d = 0; d < 2; d++) {
    PyAllocator* s = (PyAllocator*)at[d];
    const PyAllocator& o = g_py_original[d];
    if (s->malloc == kPyEntries[d].malloc) store_pointer(&s->malloc, (void*)o.malloc);
    if (s->calloc == kPyEntries[d].calloc) store_pointer(&s->calloc, (void*)o.calloc);
    if (s->realloc == kPyEntries[d].realloc) store_pointer(&s->realloc, (void*)o.realloc);
    if (s->free == kPyEntries[d].free) store_pointer(&s->free, (void*)o.free);
  }
}

}  // namespace
