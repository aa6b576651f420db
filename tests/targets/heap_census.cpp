/* A big process's heap before memhook attaches, every part known (issue 33's test target):
 * objects of three polymorphic classes (shapes::Plugin in a shared library), every other
 * Session freed (holes in the small bins), Orders freed into tcache and fastbins, strings of
 * two sizes, a block pinning the top of the main heap over a 32 MiB hole, four threads with their
 * own arenas, two blocks above the mmap threshold, and a 64 MiB anonymous mapping half touched.
 * The mapping lies right below the mmapped blocks and the first thread's stack right below the
 * mapping, as Linux 6.1 places them (and merges them into one mapping: later kernels keep
 * glibc's stacks apart, and align large mappings).
 * Commands: "truth" prints the counts and glibc's own statistics (mallinfo, malloc_stats),
 * "trim" calls malloc_trim(0) and prints RSS before and after, "corrupt" overwrites a live
 * chunk's header, "free" frees some of what was allocated before (1000 Orders, 500 Plugins,
 * the 1 MiB block), "grow" allocates 2000 more Orders and then 40 MiB in 10,000-byte blocks
 * (the hole filled, the top of the main heap grown: the last one holds it). Nothing here
 * allocates after setup but what a command says. */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <string>

#include "harness.h"

namespace shapes {
struct Plugin;
Plugin* make_plugin();
void drop_plugin(Plugin*);
}  // namespace shapes

struct Order {
  virtual ~Order() {}
  virtual int id() const { return 1; }
  long fields[4];
};
struct Session {
  virtual ~Session() {}
  virtual int id() const { return 2; }
  char buf[200];
};

enum { kOrders = 20000, kSessions = 6000, kPlugins = 5000, kPerThread = 1000, kThreads = 4,
       kHole = 8000, kShort = 300, kLong = 200 };

static Order* orders[kOrders];
static Session* sessions[kSessions];
static shapes::Plugin* plugins[kPlugins];
static std::string* strings[kShort + kLong];
static void* big[2];
static void* pin;
static long live_orders, live_sessions;
static pthread_barrier_t built;

static void* worker(void*) {
  Order* mine[kPerThread];
  for (auto& o : mine) o = new Order();
  for (int i = 0; i < kPerThread; i += 10) delete mine[i];  /* tcache, then fastbins */
  __atomic_add_fetch(&live_orders, kPerThread - kPerThread / 10, __ATOMIC_RELAXED);
  pthread_barrier_wait(&built);
  for (;;) pause();
  return mine[1];
}

NOINLINE static void* grow_heap() {
  void* last = NULL;
  for (int i = 0; i < 4000; i++) memset(last = malloc(10000), 5, 10000);
  return last;
}

/* An anonymous mapping of `size` bytes ending at `end`. */
static void* below(char* end, size_t size) {
  void* p = mmap(end - size, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED) perror("mmap"), exit(1);
  return p;
}

static long rss_bytes() {
  char buf[128] = {0};
  int fd = open("/proc/self/statm", O_RDONLY);
  if (read(fd, buf, sizeof buf - 1) <= 0) buf[0] = 0;
  close(fd);
  long pages = 0, resident = 0;
  sscanf(buf, "%ld %ld", &pages, &resident);
  return resident * sysconf(_SC_PAGESIZE);
}

int main() {
  dup2(1, 2); /* malloc_stats() writes to stderr: into the test's pipe, in order */
  /* First, while no free chunk could hold them: above the mmap threshold, so mmapped. */
  memset(big[0] = malloc(1 << 20), 2, 1 << 20);
  memset(big[1] = malloc(3 << 20), 3, 3 << 20);
  for (auto& o : orders) o = new Order();
  for (auto& s : sessions) s = new Session();
  for (auto& p : plugins) p = shapes::make_plugin();
  for (int i = 0; i < kShort; i++) strings[i] = new std::string(2001, 's');
  for (int i = 0; i < kLong; i++) strings[kShort + i] = new std::string(7001, 'l');
  void* hole[kHole];
  for (auto& h : hole) memset(h = malloc(4000), 1, 4000);
  pin = malloc(64);
  for (auto& h : hole) free(h);
  for (int i = 0; i < kSessions; i += 2) delete sessions[i];
  live_sessions = kSessions / 2;
  for (int i = 0; i < kOrders; i += 40) delete orders[i];
  __atomic_add_fetch(&live_orders, kOrders - kOrders / 40, __ATOMIC_RELAXED);
  char* mapping = (char*)below((char*)big[1] - 16, 64 << 20);
  memset(mapping, 4, 32 << 20);
  pthread_barrier_init(&built, NULL, kThreads + 1);
  pthread_t t[kThreads];
  /* The first thread's stack as glibc makes one (its default size, a guard page at its
   * bottom), below the mapping. */
  struct rlimit stack_limit;
  getrlimit(RLIMIT_STACK, &stack_limit);
  const size_t stack_size = stack_limit.rlim_cur;
  char* block = (char*)below(mapping, stack_size);
  mprotect(block, 4096, PROT_NONE);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstack(&attr, block + 4096, stack_size - 4096);
  for (auto& th : t) pthread_create(&th, &th == t ? &attr : NULL, worker, NULL);
  pthread_barrier_wait(&built);

  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "truth")) {
      printf("classes Order %ld Session %ld shapes::Plugin %d\n", live_orders, live_sessions,
             kPlugins);
#if __GLIBC__ > 2 || __GLIBC_MINOR__ >= 33
      struct mallinfo2 mi = mallinfo2();
#else
      struct mallinfo mi = mallinfo();
#endif
      printf("mallinfo arena %zu ordblks %zu smblks %zu hblks %zu hblkhd %zu fsmblks %zu "
             "uordblks %zu fordblks %zu keepcost %zu\n",
             (size_t)mi.arena, (size_t)mi.ordblks, (size_t)mi.smblks, (size_t)mi.hblks,
             (size_t)mi.hblkhd, (size_t)mi.fsmblks, (size_t)mi.uordblks, (size_t)mi.fordblks,
             (size_t)mi.keepcost);
      fflush(stdout);
      malloc_stats();
      printf("end of truth\n");
    } else if (!strcmp(cmd, "trim")) {
      long before = rss_bytes();
      malloc_trim(0);
      printf("trim before %ld after %ld\n", before, rss_bytes());
    } else if (!strcmp(cmd, "free")) {
      int n = 0;
      for (int i = 1; n < 1000; i++)
        if (i % 40) delete orders[i], orders[i] = NULL, n++;
      for (int i = 0; i < 500; i++) shapes::drop_plugin(plugins[i]);
      free(big[0]);
      live_orders -= 1000;
    } else if (!strcmp(cmd, "grow")) {
      for (int i = 0; i < 2000; i++) new Order();
      live_orders += 2000;
      grow_heap();
    } else if (!strcmp(cmd, "corrupt")) {
      ((size_t*)sessions[kSessions / 2 + 1])[-1] = 0x7; /* size 0, every flag */
    }
    harness_done();
  }
  return 0;
}
