// NCCL all-reduce for CUDA builds: the gradients go to the device, are summed across ranks with
// ncclAllReduce on the communicator's stream, and come back. Ranks exchange the ncclUniqueId
// through the rendezvous directory (rank 0 writes it, atomically; the others wait for it).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/strings.h"
#include "trainer/comm.h"

namespace conveyor::trainer {
namespace {

class NcclComm final : public Communicator {
 public:
  NcclComm(int rank, int size, int device, ncclComm_t comm, cudaStream_t stream)
      : rank_(rank), size_(size), device_(device), comm_(comm), stream_(stream) {}
  ~NcclComm() override {
    cudaSetDevice(device_);
    if (buf_) cudaFree(buf_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  absl::Status AllreduceSum(float* data, size_t count) override {
    cudaSetDevice(device_);
    if (count > capacity_) {
      if (buf_) cudaFree(buf_);
      if (cudaMalloc(&buf_, count * sizeof(float)) != cudaSuccess) {
        buf_ = nullptr;
        return absl::ResourceExhaustedError("cudaMalloc for the gradient buffer failed");
      }
      capacity_ = count;
    }
    cudaMemcpyAsync(buf_, data, count * sizeof(float), cudaMemcpyHostToDevice, stream_);
    const ncclResult_t r = ncclAllReduce(buf_, buf_, count, ncclFloat, ncclSum, comm_, stream_);
    if (r != ncclSuccess) return absl::UnavailableError(StrCat("ncclAllReduce: ", ncclGetErrorString(r)));
    cudaMemcpyAsync(data, buf_, count * sizeof(float), cudaMemcpyDeviceToHost, stream_);
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return absl::InternalError(StrCat("CUDA: ", cudaGetErrorString(e)));
    return absl::OkStatus();
  }

 private:
  int rank_, size_, device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  float* buf_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

bool NcclDeviceUsable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNccl(int rank, int size, const std::string& dir,
                                                         double timeout_s) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError("--comm nccl: no CUDA device is usable here");
  }
  if (dir.empty()) return absl::InvalidArgumentError("nccl needs a rendezvous directory (--rendezvous DIR)");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/nccl-unique-id";
  ncclUniqueId id;
  if (rank == 0) {
    ncclGetUniqueId(&id);
    {
      std::ofstream f(path + ".tmp", std::ios::binary);
      f.write(id.internal, sizeof(id.internal));
    }
    std::filesystem::rename(path + ".tmp", path);
  } else {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    for (;;) {
      std::ifstream f(path, std::ios::binary);
      if (f.read(id.internal, sizeof(id.internal))) break;
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(StrCat("rank ", rank, ": no NCCL id from rank 0 in ", path));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  const int device = rank % devices;
  cudaSetDevice(device);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, size, id, rank);
  if (r != ncclSuccess) {
    cudaStreamDestroy(stream);
    return absl::UnavailableError(StrCat("ncclCommInitRank (rank ", rank, " of ", size, "): ",
                                         ncclGetErrorString(r)));
  }
  return std::unique_ptr<Communicator>(new NcclComm(rank, size, device, comm, stream));
}

}  // namespace conveyor::trainer
