#include "client/internal/stripes.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/internal/carrier.h"
#include "client/internal/raw_stream.h"
#include "client/internal/wire.h"
#include "conveyor/v1/service.pb.h"

namespace conveyor::client {

StripeReceiver::StripeReceiver(uint32_t streams, std::string request,
                               const std::function<std::shared_ptr<grpc::Channel>(uint32_t)>& channel,
                               const std::function<void(grpc::ClientContext*)>& prepare)
    : streams_(streams) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::string> requests;
  for (uint32_t i = 0; i < streams_; ++i) {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    prepare(contexts_.back().get());
    channels.push_back(channel(i));
    v1::StreamBatchesRequest req;
    req.ParseFromString(request);
    req.set_stripe_index(i);
    requests.push_back(req.SerializeAsString());
  }
  readers_ = std::make_unique<WorkerPool>(
      "conveyor-stripe", static_cast<int>(streams_),
      [this, channels = std::move(channels), requests = std::move(requests)](int w) {
        const auto i = static_cast<uint32_t>(w);
        grpc::ClientContext& ctx = *contexts_[i];
        RawStream call(channels[i], &ctx, requests[i]);
        absl::Status local;
        std::vector<grpc::Slice> slices;
        while (call.ok() && local.ok()) {
          grpc::ByteBuffer bb;
          if (!call.Read(&bb)) break;
          slices.clear();
          wire::Message m;
          if (!bb.Dump(&slices).ok() || !wire::ParseMessage(&slices, &m) || m.start || m.header || !m.data_at) {
            local = absl::DataLossError(absl::StrCat("stripe stream ", i, " sent a message that is not payload"));
            break;
          }
          local = Deliver(i, m.stripe_batch, m.offset, m.data_size, &*m.data_at);
        }
        if (!local.ok()) ctx.TryCancel();
        const grpc::Status status = call.Finish();
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        if (!local.ok() && !absl::IsCancelled(local)) {
          if (error_.ok()) error_ = local;
        } else if (!status.ok() && error_.ok()) {
          error_ = absl::UnavailableError(absl::StrCat("stripe stream ", i, " ended: ", status.error_message()));
        }
        cv_.SignalAll();
      });
}

StripeReceiver::~StripeReceiver() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  for (auto& ctx : contexts_) ctx->TryCancel();
  readers_.reset();  // joins
}

absl::Status StripeReceiver::Deliver(uint32_t i, uint64_t n, uint64_t offset, uint64_t size, wire::SliceReader* data) {
  uint8_t* dst = nullptr;
  {
    absl::MutexLock lock(&mu_);
    // Wait until the stream fills batch n: its header may still be on its way.
    while (!stopping_ && error_.ok() && n >= next_ && !(filling_ && batch_ == n)) cv_.Wait(&mu_);
    if (stopping_ || !error_.ok()) return absl::CancelledError("stopping");
    if (n < next_) {
      return absl::DataLossError(absl::StrCat("stripe stream ", i, " sent bytes of batch ", n,
                                              " of the stream, which was already complete"));
    }
    uint64_t end = 0;
    if (__builtin_add_overflow(offset, size, &end) || end > size_) {
      return absl::DataLossError(absl::StrCat("stripe stream ", i, " sent payload bytes [", offset, ", ", offset + size,
                                              ") of batch ", n, ", whose payload is ", size_, " bytes"));
    }
    // No byte twice: the pieces received so far must not overlap this one.
    auto next = received_.lower_bound(offset);
    const bool overlaps = (next != received_.end() && next->first < end) ||
                          (next != received_.begin() && std::prev(next)->second > offset);
    if (size == 0 || overlaps) {
      return absl::DataLossError(absl::StrCat("stripe stream ", i, " sent payload bytes [", offset, ", ", end,
                                              ") of batch ", n, " again, or none"));
    }
    received_.emplace(offset, end);
    dst = dst_;
    ++copying_;
  }
  const bool copied = data->Copy(dst + offset, size);
  absl::MutexLock lock(&mu_);
  --copying_;
  if (copied) filled_ += size;
  cv_.SignalAll();
  if (!copied) return absl::DataLossError(absl::StrCat("stripe stream ", i, " sent a truncated message"));
  return absl::OkStatus();
}

absl::Status StripeReceiver::Fill(uint64_t n, uint8_t* dst, uint64_t size, const std::function<bool()>& stop) {
  absl::MutexLock lock(&mu_);
  if (n != next_) {
    return absl::DataLossError(absl::StrCat("striped batch ", n, " where batch ", next_, " of the stream was due"));
  }
  filling_ = true;
  batch_ = n;
  dst_ = dst;
  size_ = size;
  filled_ = 0;
  received_.clear();
  cv_.SignalAll();
  absl::Status result;
  for (;;) {
    if (filled_ == size_ && copying_ == 0) break;
    if (!error_.ok()) {
      result = error_;
      break;
    }
    if (stop()) {
      result = absl::CancelledError("the client stopped");
      break;
    }
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
  }
  // Copies still in flight write into `dst` (the caller's block): wait for them before it goes.
  while (copying_ > 0) cv_.Wait(&mu_);
  filling_ = false;
  next_ = n + 1;
  cv_.SignalAll();
  return result;
}

namespace {

// The stream's striped batches: each header comes alone on the stream (payload_striped, last),
// and the receiving thread waits here until the stripes delivered every byte of its payload.
class StripeSource final : public PayloadSource {
 public:
  StripeSource(std::unique_ptr<StripeReceiver> stripes, const CarrierStream& stream)
      : stripes_(std::move(stripes)), target_(stream.target), allocate_(stream.allocate), stopped_(stream.stopped) {}
  std::string_view transport() const override { return "grpc_striped"; }
  bool Carries(const wire::Message& m) const override { return m.payload_striped; }

  absl::Status Take(wire::Message& m, InboundPayload* p) override {
    if (!m.header || !m.last || m.data_at || !m.payload_striped) {
      return absl::DataLossError(absl::StrCat("server ", target_, " sent a striped batch with payload messages"));
    }
    ASSIGN_OR_RETURN(p->storage, allocate_(p->bytes));
    absl::Status filled = stripes_->Fill(p->index, p->storage->block.data, p->bytes, stopped_);
    if (absl::IsUnavailable(filled) || absl::IsCancelled(filled)) return filled;
    if (!filled.ok()) return absl::DataLossError(absl::StrCat("server ", target_, ": ", filled.message()));
    p->filled = p->bytes;
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<StripeReceiver> stripes_;  // destroyed with the stream: cancels and joins its stripes
  std::string target_;
  BlockAllocator allocate_;
  std::function<bool()> stopped_;
};

}  // namespace

bool OfferStripes(const ClientOptions& o, v1::StreamBatchesRequest* request, std::string*) {
  if (o.payload_streams <= 1) return false;
  request->set_payload_streams(o.payload_streams);
  return true;
}

absl::StatusOr<std::shared_ptr<PayloadSource>> AcceptStripes(const CarrierStream& stream, const v1::StreamStart& start,
                                                             std::string*) {
  if (start.payload_streams() == 0) return nullptr;
  if (start.payload_streams() > stream.options->payload_streams || start.stripe_token().empty()) {
    return absl::DataLossError(absl::StrCat("server ", stream.target, " grants ", start.payload_streams(),
                                            " stripe streams; this client asked for ", stream.options->payload_streams));
  }
  v1::StreamBatchesRequest stripe;
  stripe.set_protocol_version(ProtocolVersion());
  stripe.set_stripe_token(start.stripe_token());
  return std::make_shared<StripeSource>(
      std::make_unique<StripeReceiver>(start.payload_streams(), stripe.SerializeAsString(), stream.channel,
                                       stream.prepare),
      stream);
}

}  // namespace conveyor::client
