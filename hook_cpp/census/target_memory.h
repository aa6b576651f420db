// The target's memory as the census reads it: from outside, while the target runs. A read is
// a copy of those bytes at that moment and nothing more, so every structure built from it is
// validated by its reader (glibc_heap.h), never trusted.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace memhook::census {

constexpr uint64_t kPage = 4096;

// /proc/PID/mem, opened by memhook (the fd is the caller's).
class TargetMemory {
 public:
  explicit TargetMemory(int mem_fd) : fd_(mem_fd) {}

  // Up to n bytes at addr; how many were read (short where a page cannot be read).
  size_t read_some(uint64_t addr, void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = pread(fd_, static_cast<char*>(out) + done, n - done, (off_t)(addr + done));
      if (r <= 0) break;
      done += size_t(r);
    }
    bytes_read_ += done;
    return done;
  }
  bool read(uint64_t addr, void* out, size_t n) { return read_some(addr, out, n) == n; }
  bool word(uint64_t addr, uint64_t* out) { return read(addr, out, 8); }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  int fd_;
  uint64_t bytes_read_ = 0;
};

// Which pages of a range are resident (or swapped), from /proc/PID/pagemap, with prefix sums so
// that the resident bytes of any sub-range cost O(1): how a chunk's bytes split into RSS.
class ResidentPages {
 public:
  ResidentPages() = default;
  ResidentPages(int pagemap_fd, uint64_t lo, uint64_t hi) : lo_(lo & ~(kPage - 1)) {
    const uint64_t pages = ((hi + kPage - 1) & ~(kPage - 1)) / kPage - lo_ / kPage;
    std::vector<uint64_t> entries(pages);
    ssize_t got = pagemap_fd < 0 ? -1 : pread(pagemap_fd, entries.data(), pages * 8,
                                              (off_t)(lo_ / kPage * 8));
    known_ = got == ssize_t(pages * 8);
    prefix_.assign(pages + 1, 0);
    swapped_.assign(pages, 0);
    for (uint64_t i = 0; i < pages; i++) {
      const bool present = known_ && (entries[i] >> 63 & 1);  // bit 63: present in RAM
      swapped_[i] = known_ && (entries[i] >> 62 & 1);           // bit 62: swapped
      prefix_[i + 1] = prefix_[i] + present;
    }
  }
  bool known() const { return known_; }
  bool present(uint64_t addr) const {
    const uint64_t i = index(addr);
    return i < swapped_.size() && prefix_[i + 1] != prefix_[i];
  }
  bool in_memory_or_swap(uint64_t addr) const {
    const uint64_t i = index(addr);
    return i < swapped_.size() && (prefix_[i + 1] != prefix_[i] || swapped_[i]);
  }
  // Resident bytes of [a, b): whole pages counted in full, the end pages in part.
  uint64_t bytes(uint64_t a, uint64_t b) const {
    if (b <= a || prefix_.empty()) return 0;
    const uint64_t pa = index(a), pb = index(b - 1);
    if (pb >= swapped_.size()) return 0;
    if (pa == pb) return present(a) ? b - a : 0;
    uint64_t sum = (prefix_[pb] - prefix_[pa + 1]) * kPage;
    if (present(a)) sum += kPage - (a & (kPage - 1));
    if (present(b - 1)) sum += ((b - 1) & (kPage - 1)) + 1;
    return sum;
  }
  // The first page boundary after addr at which the pages stop being in memory or swap: how far
  // a read-ahead may go without faulting in pages the target never touched.
  uint64_t touched_until(uint64_t addr, uint64_t limit) const {
    uint64_t p = (addr & ~(kPage - 1)) + kPage;
    while (p < limit && in_memory_or_swap(p)) p += kPage;
    return std::min(p, limit);
  }

 private:
  uint64_t index(uint64_t addr) const { return addr / kPage - lo_ / kPage; }
  uint64_t lo_ = 0;
  bool known_ = false;
  std::vector<uint64_t> prefix_;
  std::vector<uint8_t> swapped_;
};

// A read-ahead window onto one heap: chunk headers come a megabyte at a time instead of one
// pread each, and never from pages the target has not touched (reading those would map them).
class Window {
 public:
  Window(TargetMemory& mem, const ResidentPages& pages, uint64_t limit, size_t cap = 1 << 20)
      : mem_(mem), pages_(pages), limit_(limit), buf_(cap) {}

  // n bytes at addr, or nullptr if they cannot be read. `fresh`: read again even if held.
  const uint8_t* at(uint64_t addr, size_t n, bool fresh = false) {
    if (!fresh && addr >= base_ && addr + n <= base_ + len_) return buf_.data() + (addr - base_);
    if (addr + n > limit_) return nullptr;
    uint64_t end = std::min<uint64_t>(addr + buf_.size(), limit_);
    if (pages_.known()) end = std::max(std::min(end, pages_.touched_until(addr, limit_)), addr + n);
    const size_t got = mem_.read_some(addr, buf_.data(), size_t(end - addr));
    if (got < n) {
      len_ = 0;
      return nullptr;
    }
    base_ = addr;
    len_ = got;
    return buf_.data();
  }

 private:
  TargetMemory& mem_;
  const ResidentPages& pages_;
  uint64_t limit_, base_ = 0, len_ = 0;
  std::vector<uint8_t> buf_;
};

}  // namespace memhook::census
