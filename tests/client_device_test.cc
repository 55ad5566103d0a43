// Device delivery (CUDA builds): the bytes the client puts in device memory equal the host bytes
// it received, after waiting on the batch's event. Skipped, saying why, without a usable GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "client/client.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

TEST(ClientDeviceTest, DeviceBytesEqualHostBytes) {
  if (!client::Client::device_supported()) {
    GTEST_SKIP() << "no usable CUDA device here: device delivery is checked on the GPU machine";
  }
  testing::TempDir dir;
  ASSERT_SH(std::string(CONVEYOR_CLI) + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --quiet");
  testing::ServerProcess server(CONVEYOR_CLI,
                                {dir.Join("ds"), "--config",
                                 std::string(CONVEYOR_SOURCE_DIR) + "/examples/pipeline.yaml"},
                                dir.path());
  ASSERT_TRUE(server.ok()) << server.log();
  client::ClientOptions o;
  o.servers = {server.address()};
  o.max_batches = 3;
  o.device = true;
  auto c = client::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  int batches = 0;
  for (;;) {
    absl::StatusOr<std::optional<client::Batch>> next = (*c)->Next();
    ASSERT_TRUE(next.ok()) << next.status();
    if (!next->has_value()) break;
    const client::Batch* b = &**next;
    ASSERT_NE(b->ready_event, nullptr);
    ASSERT_EQ(cudaEventSynchronize(static_cast<cudaEvent_t>(b->ready_event)), cudaSuccess);
    for (const client::Tensor& t : b->tensors) {
      ASSERT_NE(t.device_data, nullptr) << t.name;
      std::vector<uint8_t> back(t.bytes);
      ASSERT_EQ(cudaMemcpy(back.data(), t.device_data, t.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(0, std::memcmp(back.data(), t.data, t.bytes)) << t.name;
    }
    ++batches;
  }
  EXPECT_EQ(batches, 3);
}

}  // namespace
}  // namespace conveyor
