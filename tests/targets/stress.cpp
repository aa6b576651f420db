// Eight threads allocate with malloc, new[], realloc and posix_memalign at random sizes, free
// with the matching call, and pass a share of their blocks to other threads to free. Every block
// carries a pattern checked before release: "check" prints how many were found corrupted.
// "leak" leaks 10 x 777 bytes from main_leak on the main thread.
#include <pthread.h>
#include <unistd.h>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include "harness.h"

enum Kind : uint32_t { kMalloc, kNew, kRealloc, kMemalign };
struct Header { uint32_t size, kind; uint64_t tag; };

static std::atomic<long> corrupt{0}, rounds{0};
static std::mutex handoff_lock;
static void* handoff[256];
static int handoff_n;

static unsigned char pattern(const Header* h, size_t i) { return (unsigned char)(h->tag + i * 31); }

static void* make(uint32_t kind, uint32_t size, uint64_t tag) {
  void* p = nullptr;
  switch (kind) {
    case kMalloc: p = malloc(size); break;
    case kNew: p = new char[size]; break;
    case kRealloc: p = realloc(malloc(16), size); break;
    case kMemalign: if (posix_memalign(&p, 64, size) != 0) p = nullptr; break;
  }
  if (!p) abort();
  Header* h = (Header*)p;
  *h = Header{size, kind, tag};
  unsigned char* b = (unsigned char*)p;
  for (size_t i = sizeof(Header); i < size; i++) b[i] = pattern(h, i);
  return p;
}

static void release(void* p) {
  Header* h = (Header*)p;
  unsigned char* b = (unsigned char*)p;
  for (size_t i = sizeof(Header); i < h->size; i++)
    if (b[i] != pattern(h, i)) { corrupt++; break; }
  if (h->kind == kNew) delete[] (char*)p; else free(p);
}

static void* worker(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void* mine[64] = {};
  for (;;) {
    unsigned r = rand_r(&seed);
    int slot = r % 64;
    if (mine[slot]) {
      if (r & 0x100) {  // hand it to whichever thread takes it next
        std::lock_guard<std::mutex> g(handoff_lock);
        if (handoff_n < 256) { handoff[handoff_n++] = mine[slot]; mine[slot] = nullptr; }
      }
      if (mine[slot]) { release(mine[slot]); mine[slot] = nullptr; }
    }
    mine[slot] = make((r >> 9) % 4, 24 + (r >> 12) % 4000, r);
    void* theirs = nullptr;
    {
      std::lock_guard<std::mutex> g(handoff_lock);
      if (handoff_n) theirs = handoff[--handoff_n];
    }
    if (theirs) release(theirs);
    if (++rounds % 512 == 0) usleep(50);
  }
  return nullptr;
}

NOINLINE static void main_leak() { for (int i = 0; i < 10; i++) memset(malloc(777), 7, 777); }

int main() {
  pthread_t t;
  for (uintptr_t i = 1; i <= 8; i++) pthread_create(&t, nullptr, worker, (void*)i);
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "leak")) main_leak();
    if (!strcmp(cmd, "check")) printf("check corrupt %ld rounds %ld\n", corrupt.load(), rounds.load());
    harness_done();
  }
  return corrupt.load() ? 1 : 0;
}
