// Five of torch's caching-allocator counters for one device, without building Python's nested dict of
// every statistic: compiled on first use by native_counters.py against the installed torch's headers,
// called through ctypes. Returns 0 with the counters in `out`, 1 where torch raised (no CUDA device).
#include <c10/cuda/CUDACachingAllocator.h>
#include <cstdint>

extern "C" int vlmtrace_torch_counters(int device, int64_t* out) {
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out[0] = stats.allocated_bytes[all].current;
    out[1] = stats.reserved_bytes[all].current;
    out[2] = stats.inactive_split_bytes[all].current;
    out[3] = stats.num_alloc_retries;
    out[4] = stats.num_ooms;
    return 0;
  } catch (...) {
    return 1;
  }
}
