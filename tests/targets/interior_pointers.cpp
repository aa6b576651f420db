// Blocks a C++ program keeps only through interior pointers on purpose, each from its own
// function (valgrind's heuristics, memhook's interior_heuristics.h): reachable, as valgrind
// says by default. Built with the pre-C++11 std::string (-D_GLIBCXX_USE_CXX11_ABI=0), whose
// pointer points past a 24-byte header.
//   "keep_string"    a std::string of 100 characters (its characters: stdstring);
//   "keep_length64"  a block whose first word is the length of the rest (length64);
//   "keep_array"     new[] of 5 objects with a destructor (newarray: the array cookie);
//   "keep_derived"   an object of two polymorphic bases, held as its second base
//                    (multipleinheritance);
//   "keep_interior"  a block held 16 bytes in, none of those shapes: possibly lost.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "harness.h"

struct WithDtor {
  ~WithDtor() { value = 0; }
  long value = 1;
};
struct A {
  virtual ~A() {}
  virtual int a() { return 1; }
  long x = 0;
};
struct B {
  virtual ~B() {}
  virtual int b() { return 2; }
  long y = 0;
};
struct C : A, B {
  int a() override { return 3; }
  int b() override { return 4; }
};

static std::string* volatile g_string_holder;
static char* volatile g_length64;
static WithDtor* volatile g_array;
static B* volatile g_derived;
static char* volatile g_interior;

NOINLINE static void keep_string() { g_string_holder = new std::string(100, 's'); }
NOINLINE static void keep_length64() {
  uint64_t* block = static_cast<uint64_t*>(malloc(8 + 88));
  block[0] = 88;
  g_length64 = reinterpret_cast<char*>(block + 1);
}
NOINLINE static void keep_array() { g_array = new WithDtor[5]; }
NOINLINE static void keep_derived() { g_derived = new C; }
NOINLINE static void keep_interior() {
  g_interior = static_cast<char*>(calloc(1, 1017)) + 16;
}

int main() {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "all")) {
      keep_string();
      keep_length64();
      keep_array();
      keep_derived();
      keep_interior();
    }
    harness_done();
  }
  return 0;
}
