/* The shared library of tests/targets/frameless.cpp: its own chain of static helpers before
 * the allocation, built without frame pointers (or with them, for the mixed build). */
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))
static volatile int lib_sink;
static char* lib_kept[4096];
static int lib_nkept;

NOINLINE static char* lib_step3(const char* s) {
  char* p = strdup(s);
  lib_sink++;
  return p;
}
NOINLINE static char* lib_step2(const char* s) {
  char* p = lib_step3(s);
  lib_sink++;
  return p;
}
NOINLINE static char* lib_step1(const char* s) {
  char* p = lib_step2(s);
  lib_sink++;
  return p;
}

/* strdup of an n - 1 character string, kept: a leak of n bytes. */
extern "C" NOINLINE void lib_leak_strdup(int n) {
  char* s = (char*)malloc(n);
  memset(s, 'l', n - 1);
  s[n - 1] = 0;
  lib_kept[lib_nkept++ % 4096] = lib_step1(s);
  free(s);
  lib_sink++;
}
