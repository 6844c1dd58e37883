// bd/cuda/status.cuh — what a bd::cuda operation returns: success, or a message that names the
// call that failed and why (CUTLASS's Status, with the text attached). Host code only.
#pragma once

#include <string>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace bd::cuda {

class Status {
public:
  static Status success() { return Status(); }
  static Status failure(std::string message) { return Status(std::move(message)); }

  bool ok() const { return message_.empty(); }
  explicit operator bool() const { return ok(); }
  /// Empty on success; otherwise what failed, what was expected, and the CUDA/cuBLAS reason.
  const std::string& message() const { return message_; }

private:
  Status() = default;
  explicit Status(std::string message) : message_(std::move(message)) {
    if (message_.empty()) message_ = "unknown failure";
  }
  std::string message_;
};

/// Success, or "<call> failed: <CUDA's reason>".
inline Status check(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return Status::success();
  return Status::failure(std::string(call) + " failed: " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
}

/// Success, or "<call> failed: <cuBLAS's reason>".
inline Status check(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::success();
  return Status::failure(std::string(call) + " failed: " + cublasGetStatusName(status) + " (" +
                         cublasGetStatusString(status) + ")");
}

}  // namespace bd::cuda
