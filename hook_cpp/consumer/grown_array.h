// An array that only grows, mapped rather than allocated: growth moves its pages with mremap
// instead of copying them, so a table of every stack's frames (100 MB for a Python program's
// 200,000 stacks), or of every stack's counts and histograms (300 MB), never stops the
// consumer to copy itself and fault in a second, larger copy (a std::vector's doubling did, for
// tens of milliseconds at a time, while the target's rings filled and dropped events). New
// elements are zero bytes (the kernel's fresh pages): for types whose zero is their default.
#pragma once
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

#include <new>
#include <type_traits>

namespace memhook {

template <typename T>
class GrownArray {
  static_assert(std::is_trivially_copyable<T>::value, "its pages are moved, not its objects");

 public:
  GrownArray() = default;
  ~GrownArray() {
    if (data_) munmap(data_, capacity_ * sizeof(T));
  }
  GrownArray(const GrownArray&) = delete;
  GrownArray& operator=(const GrownArray&) = delete;

  size_t size() const { return size_; }
  const T* data() const { return data_; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& operator[](size_t i) { return data_[i]; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

  // At least n elements, the new ones zero (it never shrinks: pages once written stay so).
  void resize(size_t n) {
    if (n <= size_) return;
    if (n > capacity_) grow(n);
    size_ = n;
  }

  void append(const T* from, size_t n) {
    if (size_ + n > capacity_) grow(size_ + n);
    memcpy(data_ + size_, from, n * sizeof(T));
    size_ += n;
  }

 private:
  static constexpr size_t kFirst = (1 << 20) / sizeof(T);  // 1 MiB, then doubling

  void grow(size_t need) {
    size_t cap = capacity_ ? capacity_ : kFirst;
    while (cap < need) cap *= 2;
    void* m = data_ ? mremap(data_, capacity_ * sizeof(T), cap * sizeof(T), MREMAP_MAYMOVE)
                    : mmap(nullptr, cap * sizeof(T), PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    // Huge pages where the kernel has them: a page fault per 2 MiB rather than per 4 KiB
    // (a hint; its zeroing costs the same).
    madvise(m, cap * sizeof(T), MADV_HUGEPAGE);
    data_ = (T*)m;
    capacity_ = cap;
  }

  T* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace memhook
