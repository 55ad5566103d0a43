// A stream that breaks right after its last batch (the server died before its OK reached the
// client) must end the client's stream, not reconnect asking for "0 more", which the protocol
// reads as no limit. The failing server is an in-process stand-in that sends N batches, then
// UNAVAILABLE: a fault a real server only shows by chance of timing.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "client/client.h"
#include "conveyor/v1/service.grpc.pb.h"
#include "server/internal/batch_encoder.h"

namespace conveyor {
namespace {

namespace pb = ::conveyor::v1;

class BreaksAfterLastBatch final : public RawStreamBatchesService {
 public:
  grpc::Status StreamRaw(grpc::ServerContext*, const pb::StreamBatchesRequest* req,
                         Stream* w) override {
    ++calls;
    pb::StreamBatchesResponse start;
    start.mutable_start()->set_protocol_version(pb::PROTOCOL_VERSION_CURRENT);
    start.mutable_start()->set_dataset_fingerprint("f");
    start.mutable_start()->set_steps_per_epoch(1000);
    w->Write(SerializeMessage(start));
    Batch b;
    b.buffer = HostBuffer::Allocate(64, false);
    b.tensors.push_back(TensorView{{"x", DType::kUint8, {1, 64}}, 0, 64});
    b.ids.push_back(SampleId{});
    const uint64_t n = req->max_batches() ? req->max_batches() : 1000;
    for (uint64_t i = 0; i < n; ++i) {
      b.cursor = Cursor{req->start().epoch(), req->start().step() + i};
      EncodeBatch(b, Cursor{b.cursor.epoch, b.cursor.step + 1}, 1 << 20,
                  [&](const grpc::ByteBuffer& m) { return w->Write(m); })
          .IgnoreError();
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server died after its last batch");
  }
  std::atomic<int> calls{0};
};

TEST(ClientEndOfStreamTest, AllBatchesReceivedThenTheStreamBreaks) {
  BreaksAfterLastBatch service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  client::ClientOptions o;
  o.servers = {"127.0.0.1:" + std::to_string(port)};
  o.max_batches = 5;
  o.reconnect_timeout_s = 5;
  auto c = client::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  int got = 0;
  absl::Status end;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<std::optional<client::Batch>> b = (*c)->Next();
    if (!b.ok() || !b->has_value()) {
      end = b.status();
      break;
    }
    EXPECT_EQ((*b)->cursor.step, static_cast<uint64_t>(got));
    ++got;
  }
  EXPECT_EQ(got, 5);
  EXPECT_TRUE(end.ok()) << "the end of the stream is not an error: " << end;
  EXPECT_EQ(service.calls.load(), 1) << "reconnected after every batch had arrived";
  server->Shutdown();
}

// The stand-in above is also a server from before position cursors: its StreamStart names no
// start, and it reads a request's start as EPOCH:STEP. A client asking it for a position must not
// be served the step: it fails, naming the server and what to do.
TEST(ClientEndOfStreamTest, APositionCursorRefusesAServerThatPredatesPositions) {
  BreaksAfterLastBatch service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  client::ClientOptions o;
  o.servers = {"127.0.0.1:" + std::to_string(port)};
  o.start = client::Cursor{0, 0, 64};
  o.max_batches = 5;
  o.reconnect_timeout_s = 5;
  auto c = client::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::optional<client::Batch>> b = (*c)->Next();
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_NE(std::string(b.status().message()).find("predates position cursors"), std::string::npos)
      << b.status();
  EXPECT_NE(std::string(b.status().message()).find("0@64"), std::string::npos) << b.status();
  server->Shutdown();
}

}  // namespace
}  // namespace conveyor

namespace conveyor {
namespace {

// A forked child (a PyTorch DataLoader worker, multiprocessing) that frees the copy of a client it
// inherited must not abort: the receiving thread exists only in the parent (joining it in the
// child throws "No such process", or hangs). The parent's client keeps working.
TEST(ClientForkTest, AForkedChildFreesItsCopyWithoutAborting) {
  client::ClientOptions o;
  o.servers = {"127.0.0.1:1"};  // nothing listens: the thread keeps retrying in the background
  o.reconnect_timeout_s = 30;
  auto c = client::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);   // a child that hangs instead of aborting fails too
    c->reset();  // ~Client in the child
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child ended with " << (WIFSIGNALED(status) ? "signal " : "status ")
      << (WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  c->reset();  // the parent's own client still cancels and joins
}

}  // namespace
}  // namespace conveyor
