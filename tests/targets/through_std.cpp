/* Leaks through the C++ standard library and libc (issue 35): "leak" keeps memory through
 * std::vector growth (keep_vector), std::map insertion (keep_map), std::make_shared
 * (keep_shared) and strdup (keep_strdup), each from its own function; the allocating frames
 * are libstdc++'s, libc's or inlined std:: code, so the frame a person would fix is the
 * keep_* function. Built with -O2 (std:: code inlined into them). And through a program's
 * own allocation wrapper as Redis has one (zmalloc, counting what it hands out): the frame to
 * fix is keep_zmalloc, its caller. */
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"

struct Session {
  int id;
  char name[40];
};

static std::vector<Session> sessions;
static std::map<int, std::string> names;
static std::vector<std::shared_ptr<Session>> shared;
static std::vector<char*> copies;

NOINLINE static void keep_vector(int n) {
  for (int i = 0; i < n; i++) sessions.push_back(Session{i, "session"});
}
NOINLINE static void keep_map(int n) {
  for (int i = 0; i < n; i++) names.emplace(i, std::string(64, 'x'));
}
NOINLINE static void keep_shared(int n) {
  for (int i = 0; i < n; i++) shared.push_back(std::make_shared<Session>());
}
NOINLINE static void keep_strdup(int n) {
  for (int i = 0; i < n; i++) copies.push_back(strdup("a string kept forever"));
}

static size_t used_memory;
extern "C" NOINLINE void* zmalloc(size_t size) {
  void* p = malloc(size);
  used_memory += size;  // (work after the call: no tail call, zmalloc stays on the stack)
  return p;
}
NOINLINE static void keep_zmalloc(int n) {
  for (int i = 0; i < n; i++) copies.push_back(static_cast<char*>(zmalloc(300)));
}

int main() {
  char cmd[64];
  shared.reserve(64);
  copies.reserve(64);
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "leak")) {
      keep_vector(20);
      keep_map(10);
      keep_shared(10);
      keep_strdup(10);
      keep_zmalloc(7);
    }
    harness_done();
  }
  return 0;
}
