// Internal to the server (and its tests): striped payloads (docs/serving.md "Striped payloads").
// One stream's payload messages travel over K more streams, each on a connection of its own, so
// that one client is not bound by what one HTTP/2 stream and one TCP connection carry: the
// stream's handler sends each batch's header itself and hands its payload messages, in turn, to
// the K stripe streams' handlers through bounded queues. The client writes each message at its
// offset in the batch it names, so reassembly needs no order across stripes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/internal/payload_sink.h"

namespace conveyor {

struct CarrierRequest;
struct CarrierServer;
class CarrierGrant;

// The most stripe streams one stream may have.
inline constexpr uint32_t kMaxPayloadStreams = 8;

// What one stream and its stripes share. Thread-safe.
class StripeSession {
 public:
  // `streams` stripes, each queueing at most `queue_bytes` of messages (and always one).
  StripeSession(uint32_t streams, uint64_t queue_bytes);
  uint32_t streams() const { return streams_; }

  // The stream's side. Waits until every stripe joined, at most `timeout` and not past stop().
  absl::Status WaitJoined(absl::Duration timeout, const StopFn& stop);
  // Queues `m` (`bytes` of payload) for stripe `i`, waiting while its queue is full. CANCELLED
  // after stop(), UNAVAILABLE naming the stripe once one failed.
  absl::Status Push(uint32_t i, grpc::ByteBuffer m, uint64_t bytes, const StopFn& stop);
  // The stream is over: its stripes end (after sending what is queued when `drain`).
  void Close(bool drain);
  // No stripe may join any more (the stream is over); returns how many never joined. Stripes
  // that joined keep draining as Close said (none queued: they end).
  uint32_t StopJoining();

  // A stripe's side: takes place `i`, false when out of range or taken.
  bool Join(uint32_t i);
  // The next message for stripe `i`; nullopt when the session is closed and, if draining, its
  // queue is empty, or after `cancelled()`.
  std::optional<grpc::ByteBuffer> Pop(uint32_t i, const StopFn& cancelled);
  // Stripe `i` could not send: the stream fails with `why`, and its client reconnects.
  void Fail(uint32_t i, const std::string& why);

 private:
  struct Queue {
    bool joined = false;
    std::deque<std::pair<grpc::ByteBuffer, uint64_t>> messages;
    uint64_t bytes = 0;
  };
  const uint32_t streams_;
  const uint64_t queue_bytes_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Queue> queues_ ABSL_GUARDED_BY(mu_);
  uint32_t joined_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_ ABSL_GUARDED_BY(mu_) = false;
  std::string failed_ ABSL_GUARDED_BY(mu_);
};

// Sessions by token, for stripe streams to find the stream they join. Thread-safe.
class StripeRegistry {
 public:
  // A new session under a fresh random token; removed by Remove (the stream's handler, when done).
  std::shared_ptr<StripeSession> Create(uint32_t streams, uint64_t queue_bytes, std::string* token);
  std::shared_ptr<StripeSession> Find(const std::string& token);
  void Remove(const std::string& token);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<StripeSession>> sessions_ ABSL_GUARDED_BY(mu_);
};

// A stream's sink with striped payloads: each batch's header on the stream (payload_striped),
// its payload messages of at most `max_message` bytes round-robin over the session's stripes.
std::unique_ptr<PayloadSink> MakeStripedSink(std::shared_ptr<StripeSession> session, uint64_t max_message,
                                             StopFn stop);

// The carrier's row in kCarriers (server/internal/carrier.h): asked by payload_streams > 1;
// granted with as many stripe calls as the server's stripe pool has free, none below 2.
bool AsksStripes(const v1::StreamBatchesRequest& request);
std::unique_ptr<CarrierGrant> GrantStripes(const CarrierRequest& request, CarrierServer& server,
                                           v1::StreamStart* start);

}  // namespace conveyor
