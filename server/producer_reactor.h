// A server-streaming call (gRPC callback API) fed by a producer on its own thread: the producer
// writes messages one at a time (Write blocks until gRPC has taken the previous one: one write
// outstanding, so flow control reaches the producer) and returns the status to finish with.
// Cancellation (the client went away, or the server is shutting down) makes Write return false
// and calls `on_cancel` at once, so a producer blocked elsewhere (decoding) can be woken.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace conveyor {

class ProducerReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  using Produce = std::function<grpc::Status(ProducerReactor*)>;
  // Starts the producer thread. `on_done` runs once the call is over, before the reactor deletes
  // itself.
  ProducerReactor(Produce produce, std::function<void()> on_cancel, std::function<void()> on_done);

  // Blocks until gRPC has taken `message`; false when the call is cancelled or broken.
  bool Write(grpc::ByteBuffer message);
  bool cancelled() const;

 private:
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  Produce produce_;
  std::function<void()> on_cancel_, on_done_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false, write_ok_ = true, cancelled_ = false;
  grpc::ByteBuffer message_;  // the write in flight
  std::thread thread_;
};

}  // namespace conveyor
