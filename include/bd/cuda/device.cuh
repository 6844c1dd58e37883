// bd/cuda/device.cuh — what a launch needs to know of the GPU, asked once: an implementation
// queries it when constructed and its run() makes no device queries (they cost microseconds each
// and would land inside a caller's timed loop). Host code only.
#pragma once

#include <string>

#include <cuda_runtime.h>

namespace bd::cuda {

struct DeviceInfo {
  int ordinal = -1;    ///< the device current when queried; −1 if there is none
  int capability = 0;  ///< compute capability as major·10 + minor; 0 if there is no device

  bool present() const { return capability > 0; }
  std::string capability_text() const { return std::to_string(capability / 10) + "." + std::to_string(capability % 10); }

  /// The calling thread's current device.
  static DeviceInfo current() {
    DeviceInfo info;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      (void)cudaGetLastError();  // consume the "no device" error this query raised
      return info;
    }
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return info;
    }
    info.ordinal = device;
    info.capability = major * 10 + minor;
    return info;
  }
};

/// The current device's compute capability (major·10 + minor), 0 if there is none.
inline int device_capability() { return DeviceInfo::current().capability; }

}  // namespace bd::cuda
