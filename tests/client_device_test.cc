// Device delivery through the client (ClientOptions::device, device/upload.h). Where there is no
// usable GPU (a build without CUDA, no driver, no device), asking for it is a clear error naming
// the device and why; that runs everywhere. On a GPU: the bytes on the device equal the host bytes,
// a consumer stream ordered with WaitOnStream reads them without a host wait, and a trainer that
// holds every device buffer gets RESOURCE_EXHAUSTED instead of a hang. Those skip, saying why,
// without a usable GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <vector>

#include "client/client.h"
#include "device/gpu.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

#if CONVEYOR_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace conveyor {
namespace {

TEST(ClientDeviceTest, NoUsableGpuIsAClearError) {
  if (client::Client::device_supported()) GTEST_SKIP() << "a GPU is usable here";
  client::ClientOptions o;
  o.servers = {"127.0.0.1:1"};  // never contacted: Create refuses first
  o.device = true;
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Create(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_NE(c.status().message().find("cuda:0"), std::string_view::npos) << c.status();
  EXPECT_NE(c.status().message().find("no usable GPU"), std::string_view::npos) << c.status();
  // The reason itself: the build, or the CUDA runtime's own error.
  EXPECT_FALSE(ProbeGpus().reason.empty());
  EXPECT_NE(c.status().message().find(ProbeGpus().reason), std::string_view::npos) << c.status();
#if !CONVEYOR_HAVE_CUDA
  EXPECT_NE(c.status().message().find("built without CUDA"), std::string_view::npos) << c.status();
#endif
  EXPECT_EQ(client::Client::CheckDevice(3).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(client::Client::CheckDevice(3).message().find("cuda:3"), std::string_view::npos);
}

#if CONVEYOR_HAVE_CUDA
class ClientDeviceGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!client::Client::device_supported()) {
      GTEST_SKIP() << "no usable GPU: " << ProbeGpus().reason;
    }
    ASSERT_SH(std::string(CONVEYOR_CLI) + " synth --out " + dir_.Join("ds") +
              " --episodes 2 --episode-seconds 2 --quiet");
    server_ = std::make_unique<testing::ServerProcess>(
        CONVEYOR_CLI,
        std::vector<std::string>{dir_.Join("ds"), "--config",
                                 std::string(CONVEYOR_SOURCE_DIR) + "/examples/pipeline.yaml"},
        dir_.path());
    ASSERT_TRUE(server_->ok()) << server_->log();
  }

  client::ClientOptions Options(uint64_t batches) const {
    client::ClientOptions o;
    o.servers = {server_->address()};
    o.max_batches = batches;
    o.device = true;
    return o;
  }

  static void ExpectDeviceBytesEqualHostBytes(const client::Batch& b) {
    for (const client::TensorView& t : b.tensors) {
      ASSERT_NE(t.device_data, nullptr) << t.name;
      std::vector<uint8_t> back(t.bytes);
      ASSERT_EQ(cudaMemcpy(back.data(), t.device_data, t.bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(0, std::memcmp(back.data(), t.data, t.bytes)) << t.name;
    }
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::ServerProcess> server_;
};

TEST_F(ClientDeviceGpuTest, DeviceBytesEqualHostBytes) {
  for (bool shared_memory : {true, false}) {
    SCOPED_TRACE(shared_memory ? "shared memory" : "gRPC");
    client::ClientOptions o = Options(3);
    o.shared_memory = shared_memory;
    auto c = client::Client::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    int batches = 0;
    for (;;) {
      absl::StatusOr<std::optional<client::Batch>> next = (*c)->Next();
      ASSERT_TRUE(next.ok()) << next.status();
      if (!next->has_value()) break;
      const client::Batch& b = **next;
      EXPECT_EQ(b.device, 0);
      ASSERT_NE(b.ready_event, nullptr);
      ASSERT_TRUE(b.WaitDevice().ok());
      ExpectDeviceBytesEqualHostBytes(b);
      ++batches;
    }
    EXPECT_EQ(batches, 3);
  }
}

// The consumer's stream waits for the copy on the GPU (no host wait), reads on that stream,
// declares the use and drops the batch at once; every read sees its own batch's bytes although
// the device buffers are reused.
TEST_F(ClientDeviceGpuTest, StreamOrderedConsumer) {
  client::ClientOptions o = Options(12);
  o.device_buffers = 2;
  o.prefetch_batches = 1;
  auto c = client::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Read {
    std::vector<uint8_t> want;
    void* pinned = nullptr;
  };
  std::deque<Read> reads;
  for (;;) {
    absl::StatusOr<std::optional<client::Batch>> next = (*c)->Next();
    ASSERT_TRUE(next.ok()) << next.status();
    if (!next->has_value()) break;
    const client::Batch& b = **next;
    const client::TensorView& t = b.tensors.front();
    Read r;
    r.want.assign(t.data, t.data + t.bytes);
    ASSERT_EQ(cudaMallocHost(&r.pinned, t.bytes), cudaSuccess);
    ASSERT_TRUE(b.WaitOnStream(stream).ok());
    ASSERT_EQ(cudaMemcpyAsync(r.pinned, t.device_data, t.bytes, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_TRUE(b.RecordUse(stream).ok());
    reads.push_back(std::move(r));
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(reads.size(), 12u);
  for (Read& r : reads) {
    EXPECT_EQ(0, std::memcmp(r.pinned, r.want.data(), r.want.size()));
    cudaFreeHost(r.pinned);
  }
  cudaStreamDestroy(stream);
}

// A trainer keeping every device buffer and asking for more gets RESOURCE_EXHAUSTED (not a hang);
// after it drops one, the stream goes on.
TEST_F(ClientDeviceGpuTest, HoldingEveryBufferIsAnError) {
  client::ClientOptions o = Options(6);
  o.device_buffers = 2;
  o.prefetch_batches = 1;
  auto c = client::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  std::deque<client::Batch> held;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::optional<client::Batch>> next = (*c)->Next();
    ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
    held.push_back(**std::move(next));
  }
  absl::StatusOr<std::optional<client::Batch>> next = (*c)->Next();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kResourceExhausted) << next.status();
  held.pop_front();
  next = (*c)->Next();
  ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
  ExpectDeviceBytesEqualHostBytes(**next);
}
#endif  // CONVEYOR_HAVE_CUDA

}  // namespace
}  // namespace conveyor
