// The CUDA runtime (libcudart), loaded with dlopen the first time a GPU is asked for, so that
// nothing linking device/ names libcudart among its needed libraries: a trainer's
// libconveyor_c.so.1 and libconveyor_client.so.1 load on machines without CUDA, and a process
// that never asks for a device never loads it (docs/architecture.md "What a trainer links").
//
// The soname is the one of the toolkit the build compiled against (libcudart.so.MAJOR): the same
// runtime the libraries that do link it (media/'s NVDEC kernels, pipeline/device_frames.cc)
// name, so a process that has both gets one runtime, not two. Looked for on the dynamic loader's
// path (with the caller's DT_RPATH: $ORIGIN in the device bundle), then in the toolkit's library
// directory the build found.
//
// INTERNAL header: it includes <cuda_runtime_api.h> for the types and the declarations the
// pointers are typed by (never called directly). Include it only from device/'s .cc files under
// `#if CONVEYOR_HAVE_CUDA`.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/statusor.h"

namespace conveyor::cuda {

// The runtime calls device/ makes, resolved by their exported names.
struct Runtime {
  decltype(&::cudaGetErrorName) GetErrorName;
  decltype(&::cudaGetErrorString) GetErrorString;
  decltype(&::cudaGetLastError) GetLastError;
  decltype(&::cudaGetDeviceCount) GetDeviceCount;
  decltype(&::cudaGetDevice) GetDevice;
  decltype(&::cudaSetDevice) SetDevice;
  decltype(&::cudaStreamCreateWithFlags) StreamCreateWithFlags;
  decltype(&::cudaStreamDestroy) StreamDestroy;
  decltype(&::cudaStreamSynchronize) StreamSynchronize;
  decltype(&::cudaStreamWaitEvent) StreamWaitEvent;
  decltype(&::cudaEventCreateWithFlags) EventCreateWithFlags;
  decltype(&::cudaEventDestroy) EventDestroy;
  decltype(&::cudaEventRecord) EventRecord;
  decltype(&::cudaEventSynchronize) EventSynchronize;
  decltype(&::cudaEventElapsedTime) EventElapsedTime;
  decltype(&::cudaMalloc) Malloc;
  decltype(&::cudaFree) Free;
  decltype(&::cudaHostAlloc) HostAlloc;
  decltype(&::cudaFreeHost) FreeHost;
  decltype(&::cudaMemcpyAsync) MemcpyAsync;
};

// Loads `soname` from the loader's path, else from `dir`, and resolves every call of Runtime.
// FAILED_PRECONDITION naming the library, each place it was looked for and dlerror()'s reason, or
// the first call it lacks. The handle is never closed. LoadRuntime's work, on its own so that a
// test can name a library that is absent.
absl::StatusOr<Runtime> OpenRuntime(const std::string& soname, const std::string& dir);

// The runtime of the toolkit the build compiled against, loaded once per process (never
// unloaded); OpenRuntime's error when it cannot be. Thread-safe.
absl::StatusOr<const Runtime*> LoadRuntime();

// The runtime LoadRuntime() loaded. REQUIRES: LoadRuntime() succeeded (every handle device/ holds
// was made through it, so code that owns one may call this).
const Runtime& LoadedRuntime();

}  // namespace conveyor::cuda
