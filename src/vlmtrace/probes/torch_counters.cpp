// Five of torch's caching-allocator counters for one device, without building Python's nested dict of
// every statistic: compiled on first use by native_counters.py against the installed torch's headers,
// called through ctypes. Returns 0 with the counters in `out`, 1 where torch raised (no CUDA device).
//
// VLMTRACE_DEVICE_ALLOCATOR (set where torch's c10 has the device-generic allocator interface, which
// torch.accelerator's statistics use): reached through c10 alone, so no CUDA header is needed. Older
// torch: through c10::cuda, whose header includes CUDA's runtime headers.
#ifdef VLMTRACE_DEVICE_ALLOCATOR
#include <c10/core/CachingDeviceAllocator.h>
#else
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include <cstdint>

extern "C" int vlmtrace_torch_counters(int device, int64_t* out) {
  try {
    const auto index = static_cast<c10::DeviceIndex>(device);
#ifdef VLMTRACE_DEVICE_ALLOCATOR
    const auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(index);
#else
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
#endif
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
