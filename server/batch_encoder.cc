#include "server/internal/batch_encoder.h"

#include "base/status_macros.h"
#include "server/internal/payload_sink.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace conveyor {
namespace {

namespace pb = ::conveyor::v1;

pb::DType ToProto(DType t) {
  switch (t) {
    case DType::kUint8: return pb::UINT8;
    case DType::kBool: return pb::BOOL;
    case DType::kFloat32: return pb::FLOAT32;
    case DType::kInt32: return pb::INT32;
    case DType::kFloat16: return pb::FLOAT16;
    case DType::kBFloat16: return pb::BFLOAT16;
  }
  return pb::DTYPE_UNSPECIFIED;
}

// The tag and length that precede `data` (field 4, length-delimited) on the wire.
std::string DataPrefix(uint64_t size) {
  std::string p(1, static_cast<char>((pb::StreamBatchesResponse::kDataFieldNumber << 3) | 2));
  do {
    uint8_t byte = size & 0x7f;
    size >>= 7;
    if (size) byte |= 0x80;
    p.push_back(static_cast<char>(byte));
  } while (size);
  return p;
}

// A payload slice's reference to its batch buffer, dropped when gRPC is done with the bytes.
void ReleaseBuffer(void* keep) { delete static_cast<std::shared_ptr<HostBuffer>*>(keep); }

// `msg`'s other fields, then `n` bytes at `data` as field 4 without copying them.
grpc::ByteBuffer WithPayload(const pb::StreamBatchesResponse& msg, const std::shared_ptr<HostBuffer>& buffer,
                             const uint8_t* data, uint64_t n) {
  if (n == 0) return SerializeMessage(msg);
  std::string head = msg.SerializeAsString();
  head += DataPrefix(n);
  grpc::Slice slices[2] = {grpc::Slice(head), grpc::Slice()};
  slices[1] = grpc::Slice(const_cast<uint8_t*>(data), n, &ReleaseBuffer,
                          new std::shared_ptr<HostBuffer>(buffer));
  return grpc::ByteBuffer(slices, 2);
}

pb::TensorRole ToProto(TensorRole r) {
  switch (r) {
    case TensorRole::kPaddingMask: return pb::PADDING_MASK;
    case TensorRole::kSegmentIds: return pb::SEGMENT_IDS;
    case TensorRole::kPositions: return pb::POSITIONS;
    case TensorRole::kSampleInfo: return pb::SAMPLE_INFO;
    case TensorRole::kData: break;
  }
  return pb::DATA;
}

}  // namespace

void CursorToProto(const Cursor& c, pb::Cursor* out) {
  out->set_epoch(c.epoch);
  out->set_step(c.step);
  if (c.position) {
    out->set_position(*c.position);
    out->set_has_position(true);
  }
}

grpc::ByteBuffer SerializeMessage(const pb::StreamBatchesResponse& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status EncodeBatch(const Batch& b, Cursor next, uint64_t max_message,
                         const MessageWriter& write, std::optional<uint64_t> region_position,
                         const PayloadStripes* stripes) {
  std::vector<const TensorView*> order;
  for (const TensorView& t : b.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorView* x, const TensorView* y) { return x->offset < y->offset; });
  const uint64_t base = order.empty() ? 0 : order.front()->offset;
  uint64_t payload = 0;
  for (const TensorView* t : order) payload = std::max<uint64_t>(payload, t->offset + t->bytes - base);

  pb::StreamBatchesResponse msg;
  pb::BatchHeader* h = msg.mutable_header();
  CursorToProto(b.cursor, h->mutable_cursor());
  CursorToProto(next, h->mutable_next());
  h->set_consumer(b.consumer);
  h->set_consumers(b.consumers);
  for (const SampleId& id : b.ids) {
    pb::SampleId* p = h->add_ids();
    p->set_index(id.index);
    p->set_episode(id.episode);
    p->set_step(id.step);
    if (id.dataset != 0) p->set_dataset(id.dataset);
  }
  const TensorView* segment_ids = nullptr;  // packed batches only
  for (const TensorView& t : b.tensors) {
    pb::TensorHeader* p = h->add_tensors();
    p->set_name(t.name);
    p->set_dtype(ToProto(t.dtype));
    for (int64_t d : t.shape) p->add_shape(d);
    p->set_offset(t.offset - base);
    p->set_bytes(t.bytes);
    p->set_role(ToProto(t.role));
    if (t.role == TensorRole::kSegmentIds) segment_ids = &t;
  }
  h->set_payload_bytes(payload);
  if (const TensorView* seg = segment_ids) {
    pb::PackingInfo* pk = h->mutable_packing();
    pk->set_sequences(seg->shape.size() > 0 ? static_cast<uint32_t>(seg->shape[0]) : 0);
    pk->set_max_tokens(seg->shape.size() > 1 ? static_cast<uint32_t>(seg->shape[1]) : 0);
    const int32_t* v = reinterpret_cast<const int32_t*>(b.data(*seg));
    const size_t n = seg->bytes / 4;
    size_t used = 0;
    for (size_t i = 0; i < n; ++i) used += v[i] != 0;
    pk->set_fill_ratio(n ? static_cast<double>(used) / n : 0);
  }
  const uint8_t* data = b.buffer ? b.buffer->data() + base : nullptr;
  const absl::Status gone = absl::CancelledError("the client went away");
  if (region_position && payload > 0) {
    msg.set_in_shared_memory(true);
    msg.set_shm_position(*region_position);
    msg.set_last(true);
    return write(SerializeMessage(msg)) ? absl::OkStatus() : gone;
  }
  if (stripes && payload > 0) {
    // The header alone here; the payload's messages go to the stripes, each naming its batch.
    msg.set_payload_striped(true);
    msg.set_last(true);
    if (!write(SerializeMessage(msg))) return gone;
    msg.Clear();
  }
  uint64_t begin = 0;
  uint64_t index = 0;
  do {
    uint64_t end = std::min(payload, begin + max_message);
    // End before the first tensor that starts inside this message and would cross its end.
    for (const TensorView* t : order) {
      const uint64_t ts = t->offset - base, te = ts + t->bytes;
      if (ts > begin && ts < end && te > end) {
        end = ts;
        break;
      }
    }
    // Fields 2 (the header, first message only), 3 and 5 by protobuf, then field 4 over the
    // batch buffer.
    msg.set_offset(begin);
    msg.set_last(end >= payload);
    if (stripes && payload > 0) {
      msg.set_stripe_batch(stripes->batch);
      RETURN_IF_ERROR(stripes->write(index++, WithPayload(msg, b.buffer, data + begin, end - begin), end - begin));
    } else if (!write(WithPayload(msg, b.buffer, data + begin, end - begin))) {
      return gone;
    }
    msg.Clear();
    begin = end;
  } while (begin < payload);
  return absl::OkStatus();
}

namespace {

class GrpcSink final : public PayloadSink {
 public:
  explicit GrpcSink(uint64_t max_message) : max_message_(max_message) {}
  std::string_view transport() const override { return "grpc"; }
  absl::Status Send(const Batch& batch, const Cursor& next, const MessageWriter& write) override {
    return EncodeBatch(batch, next, max_message_, write);
  }

 private:
  uint64_t max_message_;
};

}  // namespace

std::unique_ptr<PayloadSink> MakeGrpcSink(uint64_t max_message) {
  return std::make_unique<GrpcSink>(max_message);
}

RawStreamBatchesService::RawStreamBatchesService() {
  // Method 0 is StreamBatches, the first rpc of conveyor.v1.Conveyor (the index the generated
  // WithSplitStreamingMethod_StreamBatches uses).
  MarkMethodStreamed(0, new grpc::internal::SplitServerStreamingHandler<pb::StreamBatchesRequest, grpc::ByteBuffer>(
                            [this](grpc::ServerContext* ctx, Stream* stream) {
                              pb::StreamBatchesRequest request;
                              if (!stream->Read(&request)) {
                                return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                                    "the StreamBatchesRequest could not be read or parsed");
                              }
                              return StreamRaw(ctx, &request, stream);
                            }));
}

grpc::Status RawStreamBatchesService::StreamBatches(grpc::ServerContext*, const pb::StreamBatchesRequest*,
                                                    grpc::ServerWriter<pb::StreamBatchesResponse>*) {
  return grpc::Status(grpc::StatusCode::INTERNAL, "StreamBatches is served by StreamRaw");
}

}  // namespace conveyor
