// device/internal/cudart.h: the CUDA runtime through dlopen. Compiled only when CONVEYOR_HAVE_CUDA;
// CONVEYOR_CUDART_SONAME and CONVEYOR_CUDART_DIR come from device/CMakeLists.txt.
#include "device/internal/cudart.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "base/strings.h"

namespace conveyor::cuda {

namespace {

// A name as the header spells it after macro expansion: where cuda_runtime_api.h maps a call to a
// versioned or per-thread-stream symbol (cudaMemcpyAsync -> cudaMemcpyAsync_ptsz under
// CUDA_API_PER_THREAD_DEFAULT_STREAM), dlsym must ask for that symbol.
#define CONVEYOR_CUDART_STRING2(x) #x
#define CONVEYOR_CUDART_STRING(x) CONVEYOR_CUDART_STRING2(x)

template <typename F>
void Resolve(void* handle, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr && missing->empty()) *missing = name;
}

}  // namespace

absl::StatusOr<Runtime> OpenRuntime(const std::string& soname, const std::string& dir) {
  const std::string fallback = dir + "/" + soname;
  std::string from = soname;
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    const std::string tried = StrCat(soname, " (", e != nullptr ? e : "not found", ")");
    from = fallback;
    handle = dlopen(fallback.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      e = dlerror();
      return absl::FailedPreconditionError(
          StrCat("the CUDA runtime ", soname, " could not be loaded: tried ", tried, " and ",
                 fallback, " (", e != nullptr ? e : "not found",
                 "); install the CUDA runtime of that major version or add its directory to "
                 "LD_LIBRARY_PATH"));
    }
  }
  Runtime r{};
  std::string missing;
#define CONVEYOR_CUDART_RESOLVE(field, call) \
  Resolve(handle, CONVEYOR_CUDART_STRING(call), &r.field, &missing)
  CONVEYOR_CUDART_RESOLVE(GetErrorName, cudaGetErrorName);
  CONVEYOR_CUDART_RESOLVE(GetErrorString, cudaGetErrorString);
  CONVEYOR_CUDART_RESOLVE(GetLastError, cudaGetLastError);
  CONVEYOR_CUDART_RESOLVE(GetDeviceCount, cudaGetDeviceCount);
  CONVEYOR_CUDART_RESOLVE(GetDevice, cudaGetDevice);
  CONVEYOR_CUDART_RESOLVE(SetDevice, cudaSetDevice);
  CONVEYOR_CUDART_RESOLVE(StreamCreateWithFlags, cudaStreamCreateWithFlags);
  CONVEYOR_CUDART_RESOLVE(StreamDestroy, cudaStreamDestroy);
  CONVEYOR_CUDART_RESOLVE(StreamSynchronize, cudaStreamSynchronize);
  CONVEYOR_CUDART_RESOLVE(StreamWaitEvent, cudaStreamWaitEvent);
  CONVEYOR_CUDART_RESOLVE(EventCreateWithFlags, cudaEventCreateWithFlags);
  CONVEYOR_CUDART_RESOLVE(EventDestroy, cudaEventDestroy);
  CONVEYOR_CUDART_RESOLVE(EventRecord, cudaEventRecord);
  CONVEYOR_CUDART_RESOLVE(EventSynchronize, cudaEventSynchronize);
  CONVEYOR_CUDART_RESOLVE(EventElapsedTime, cudaEventElapsedTime);
  CONVEYOR_CUDART_RESOLVE(Malloc, cudaMalloc);
  CONVEYOR_CUDART_RESOLVE(Free, cudaFree);
  CONVEYOR_CUDART_RESOLVE(HostAlloc, cudaHostAlloc);
  CONVEYOR_CUDART_RESOLVE(FreeHost, cudaFreeHost);
  CONVEYOR_CUDART_RESOLVE(MemcpyAsync, cudaMemcpyAsync);
#undef CONVEYOR_CUDART_RESOLVE
  if (!missing.empty()) {
    // Left loaded: the process may hold it through another library too.
    return absl::FailedPreconditionError(
        StrCat("the CUDA runtime ", from, " has no ", missing,
               ": it is not a CUDA runtime, or one older than the toolkit Conveyor was built "
               "with"));
  }
  return r;
}

namespace {

const absl::StatusOr<Runtime>& Once() {
  // Function-local static: loaded once, thread-safe, and never before a GPU is asked for.
  static const absl::StatusOr<Runtime> runtime =
      OpenRuntime(CONVEYOR_CUDART_SONAME, CONVEYOR_CUDART_DIR);
  return runtime;
}

}  // namespace

absl::StatusOr<const Runtime*> LoadRuntime() {
  const absl::StatusOr<Runtime>& r = Once();
  if (!r.ok()) return r.status();
  return &*r;
}

const Runtime& LoadedRuntime() {
  const absl::StatusOr<Runtime>& r = Once();
  // A handle exists only if the load succeeded; reaching here otherwise is a bug in device/.
  if (!r.ok()) std::abort();
  return *r;
}

}  // namespace conveyor::cuda
