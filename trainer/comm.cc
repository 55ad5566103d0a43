#include "trainer/comm.h"

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>

#include "base/strings.h"

namespace conveyor::trainer {

#if CONVEYOR_TRAINER_NCCL
absl::StatusOr<std::unique_ptr<Communicator>> CreateNccl(int rank, int world_size,
                                                         const std::string& dir, double timeout_s);
bool NcclDeviceUsable();
#endif

namespace {

class NoComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "none"; }
  absl::Status AllreduceSum(float*, size_t) override { return absl::OkStatus(); }
};

class GlooComm final : public Communicator {
 public:
  GlooComm(std::shared_ptr<gloo::rendezvous::Context> ctx) : ctx_(std::move(ctx)) {}
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::string name() const override { return "gloo"; }
  absl::Status AllreduceSum(float* data, size_t count) override {
    try {
      gloo::AllreduceOptions opts(ctx_);
      opts.setOutput(data, count);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
          &gloo::sum<float>));
      gloo::allreduce(opts);
    } catch (const std::exception& e) {
      return absl::UnavailableError(StrCat("gloo allreduce (rank ", ctx_->rank, " of ", ctx_->size,
                                           "): ", e.what()));
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
};

absl::StatusOr<std::unique_ptr<Communicator>> CreateGloo(int rank, int world_size,
                                                         const std::string& dir, double timeout_s,
                                                         const std::string& host) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("gloo needs a rendezvous directory that every rank sees (--rendezvous DIR)");
  }
  std::filesystem::create_directories(dir);
  try {
    gloo::transport::tcp::attr attr;
    if (host.empty()) {
      char name[256] = {};
      gethostname(name, sizeof name - 1);
      attr.hostname = name;
    } else {
      attr.hostname = host;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    ctx->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    ctx->connectFullMesh(store, device);
    return std::unique_ptr<Communicator>(new GlooComm(std::move(ctx)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(StrCat("gloo rendezvous in ", dir, " (rank ", rank, " of ",
                                         world_size, "): ", e.what()));
  }
}

}  // namespace

bool NcclAvailable() {
#if CONVEYOR_TRAINER_NCCL
  return NcclDeviceUsable();
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const std::string& kind, int rank,
                                                                 int world_size,
                                                                 const std::string& dir,
                                                                 double timeout_s,
                                                                 const std::string& host) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(StrCat("rank ", rank, " of ", world_size,
                                             ": need 0 <= rank < world size"));
  }
  std::string k = kind;
  if (k == "auto") k = world_size == 1 ? "none" : NcclAvailable() ? "nccl" : "gloo";
  if (k == "none") {
    if (world_size != 1) {
      return absl::InvalidArgumentError("--comm none works for one rank only: gradients must be averaged");
    }
    return std::unique_ptr<Communicator>(new NoComm());
  }
  if (k == "gloo") return CreateGloo(rank, world_size, dir, timeout_s, host);
  if (k == "nccl") {
#if CONVEYOR_TRAINER_NCCL
    return CreateNccl(rank, world_size, dir, timeout_s);
#else
    return absl::FailedPreconditionError("--comm nccl needs a build with CUDA and NCCL; this one has neither");
#endif
  }
  return absl::InvalidArgumentError(StrCat("--comm '", kind, "': expected auto, gloo, nccl or none"));
}

}  // namespace conveyor::trainer
