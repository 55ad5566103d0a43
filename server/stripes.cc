#include "server/internal/stripes.h"

#include <algorithm>
#include <random>

#include "base/strings.h"
#include "server/internal/carrier.h"

namespace conveyor {

StripeSession::StripeSession(uint32_t streams, uint64_t queue_bytes)
    : streams_(streams), queue_bytes_(queue_bytes), queues_(streams) {}

absl::Status StripeSession::WaitJoined(absl::Duration timeout, const StopFn& stop) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (joined_ < streams_) {
    if (stop()) return absl::CancelledError("the stream ended before its stripes joined");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          StrCat(joined_, " of ", streams_, " stripe streams joined within ", absl::FormatDuration(timeout)));
    }
    // Short waits: stop() is the stream's context, which signals nobody here.
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

absl::Status StripeSession::Push(uint32_t i, grpc::ByteBuffer m, uint64_t bytes, const StopFn& stop) {
  absl::MutexLock lock(&mu_);
  Queue& q = queues_[i % streams_];
  // One message is always admitted, so a message larger than the bound still moves.
  while (failed_.empty() && !closed_ && !q.messages.empty() && q.bytes + bytes > queue_bytes_) {
    if (stop()) return absl::CancelledError("the client went away");
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
  }
  if (!failed_.empty()) return absl::UnavailableError(failed_);
  if (closed_) return absl::CancelledError("the stream's stripes are closed");
  q.messages.emplace_back(std::move(m), bytes);
  q.bytes += bytes;
  cv_.SignalAll();
  return absl::OkStatus();
}

void StripeSession::Close(bool drain) {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  drain_ = drain;
  cv_.SignalAll();
}

uint32_t StripeSession::StopJoining() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
  return streams_ - joined_;
}

bool StripeSession::Join(uint32_t i) {
  absl::MutexLock lock(&mu_);
  if (i >= streams_ || queues_[i].joined || closed_) return false;
  queues_[i].joined = true;
  ++joined_;
  cv_.SignalAll();
  return true;
}

std::optional<grpc::ByteBuffer> StripeSession::Pop(uint32_t i, const StopFn& cancelled) {
  absl::MutexLock lock(&mu_);
  Queue& q = queues_[i];
  for (;;) {
    if (!failed_.empty() || cancelled()) return std::nullopt;
    if (!q.messages.empty() && (!closed_ || drain_)) {
      grpc::ByteBuffer m = std::move(q.messages.front().first);
      q.bytes -= q.messages.front().second;
      q.messages.pop_front();
      cv_.SignalAll();
      return m;
    }
    if (closed_) return std::nullopt;
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
  }
}

void StripeSession::Fail(uint32_t i, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (failed_.empty()) failed_ = StrCat("stripe stream ", i, " of ", streams_, " failed: ", why);
  cv_.SignalAll();
}

std::shared_ptr<StripeSession> StripeRegistry::Create(uint32_t streams, uint64_t queue_bytes, std::string* token) {
  std::random_device rd;
  token->clear();
  for (int i = 0; i < 16; ++i) *token += static_cast<char>(rd() & 0xff);
  auto session = std::make_shared<StripeSession>(streams, queue_bytes);
  absl::MutexLock lock(&mu_);
  sessions_[*token] = session;
  return session;
}

std::shared_ptr<StripeSession> StripeRegistry::Find(const std::string& token) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(token);
  return it == sessions_.end() ? nullptr : it->second;
}

void StripeRegistry::Remove(const std::string& token) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(token);
}

namespace {

class StripedSink final : public PayloadSink {
 public:
  StripedSink(std::shared_ptr<StripeSession> session, uint64_t max_message, StopFn stop)
      : session_(std::move(session)), max_message_(max_message), stop_(std::move(stop)) {}
  // The stripes send what is queued, then end: the stream's last batches are still on their way
  // when its handler returns. A client that went away ends them sooner (their contexts).
  ~StripedSink() override { session_->Close(/*drain=*/true); }
  std::string_view transport() const override { return "grpc_striped"; }
  absl::Status Send(const Batch& batch, const Cursor& next, const MessageWriter& write) override {
    // Each batch starts on the next stripe, so that small batches (one message) spread too.
    PayloadStripes stripes;
    stripes.batch = batches_;
    stripes.write = [&](uint64_t index, const grpc::ByteBuffer& m, uint64_t bytes) {
      return session_->Push(static_cast<uint32_t>((batches_ + index) % session_->streams()), m, bytes, stop_);
    };
    const absl::Status st = EncodeBatch(batch, next, max_message_, write, std::nullopt, &stripes);
    ++batches_;
    return st;
  }

 private:
  std::shared_ptr<StripeSession> session_;
  uint64_t max_message_;
  StopFn stop_;
  uint64_t batches_ = 0;  // sent on this stream: the next batch's number
};

}  // namespace

std::unique_ptr<PayloadSink> MakeStripedSink(std::shared_ptr<StripeSession> session, uint64_t max_message,
                                             StopFn stop) {
  return std::make_unique<StripedSink>(std::move(session), max_message, std::move(stop));
}

namespace {

class StripesGrant final : public CarrierGrant {
 public:
  StripesGrant(CarrierServer& server, std::shared_ptr<StripeSession> session, std::string token,
               const CarrierRequest& r)
      : server_(server), session_(std::move(session)), token_(std::move(token)), ctx_(r.ctx),
        max_message_(r.max_message) {}
  // When the stream is over no stripe may join any more; the slots of those that never joined are
  // released here, each joined one's when its call ends (server.cc ServeStripe).
  ~StripesGrant() override {
    server_.stripes.Remove(token_);
    server_.release_stripes(session_->StopJoining());
  }

  absl::StatusOr<std::unique_ptr<PayloadSink>> Connect(const StopFn& stop) override {
    if (absl::Status j = session_->WaitJoined(absl::Seconds(5), stop); !j.ok()) {
      if (ctx_->IsCancelled()) return absl::CancelledError("the client went away");
      // The client was told to expect stripes: it cannot be served without them.
      session_->Close(/*drain=*/false);
      return absl::UnavailableError(StrCat("striped payloads: ", j.message()));
    }
    return MakeStripedSink(session_, max_message_, stop);
  }

 private:
  CarrierServer& server_;
  std::shared_ptr<StripeSession> session_;
  std::string token_;
  grpc::ServerContext* ctx_;
  uint64_t max_message_;
};

}  // namespace

bool AsksStripes(const v1::StreamBatchesRequest& request) { return request.payload_streams() > 1; }

// Each stripe is a call from the stripe pool: a stream gets as many as are free.
std::unique_ptr<CarrierGrant> GrantStripes(const CarrierRequest& r, CarrierServer& server, v1::StreamStart* start) {
  const uint32_t calls = server.reserve_stripes(std::min(r.request->payload_streams(), kMaxPayloadStreams));
  if (calls == 0) return nullptr;
  std::string token;
  std::shared_ptr<StripeSession> session = server.stripes.Create(calls, 2 * r.max_message, &token);
  start->set_payload_streams(calls);
  start->set_stripe_token(token);
  return std::make_unique<StripesGrant>(server, std::move(session), std::move(token), r);
}

}  // namespace conveyor
