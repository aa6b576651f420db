// A new segment's control block, written by memhook before injection (the target checks it in
// memhook_start).
#pragma once
#include <stdint.h>

#include <unordered_map>
#include <vector>

namespace memhook {

// Size and fill a new segment file (created by Python with O_EXCL, owner-only).
void format_segment(int fd, uint32_t nrings, uint32_t ring_bytes, uint32_t depth, uint32_t clock,
                    uint64_t min_size, uint64_t max_size, uint64_t pid,
                    const std::unordered_map<int, uint64_t>& real,
                    const std::vector<uint64_t>& known, double abandon_after_s,
                    uint64_t sample_rate, bool no_avx512);

}  // namespace memhook
