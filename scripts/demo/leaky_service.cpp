// A small request-handling service that leaks slowly: the target of memhook's demo.
// Two workers serve synthetic requests forever. Per request they parse into temporary buffers
// (freed), update a bounded LRU-ish cache (steady), and — the bug — remember every session's
// token in a registry that is never pruned, plus a malloc'd audit record that is never freed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {
std::mutex mu;
std::map<int, std::string> cache;              // bounded: at most 512 entries
std::vector<std::string*> session_registry;   // grows forever: the leak

__attribute__((noinline)) std::string* remember_session(int id) {
  return new std::string("session-token-" + std::to_string(id) + std::string(64, 'x'));
}

__attribute__((noinline)) char* audit_record(int id) {
  char* rec = static_cast<char*>(malloc(48));   // never freed: the second leak
  snprintf(rec, 48, "audit %d", id);
  return rec;
}

__attribute__((noinline)) void handle_request(int id) {
  std::vector<char> body(4096, 'b');            // temporary: freed at return
  std::string parsed(body.begin(), body.begin() + 256);
  std::lock_guard<std::mutex> lock(mu);
  cache[id % 512] = parsed;
  if (id % 4 == 0) session_registry.push_back(remember_session(id));
  if (id % 16 == 0) audit_record(id);
}

void worker(int first) {
  for (int id = first;; id += 2) {
    handle_request(id);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}
}  // namespace

int main() {
  printf("leaky_service running as PID %d\n", getpid());
  fflush(stdout);
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
}
