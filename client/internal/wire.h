// Parsing conveyor.v1.StreamBatchesResponse by hand from gRPC's receive slices, so that the
// payload (`data`) is copied once, straight into the batch block, instead of into a protobuf
// string first. Internal to the client; a separate header so that tests and the fuzzer reach it.
#pragma once

#include <grpcpp/support/slice.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/types.h"
#include "conveyor/v1/service.pb.h"

namespace conveyor::client::wire {

// Reads protobuf wire format across the slices of a message without joining them.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>* slices);
  bool eof() const { return i_ >= s_->size(); }
  bool Varint(uint64_t* v);
  bool Copy(uint8_t* dst, uint64_t n);  // false when fewer than n bytes are left
  bool Skip(uint64_t n);
  bool String(uint64_t n, std::string* out);  // at most 64 MiB

 private:
  bool Byte(uint8_t* b);
  void Settle();
  const std::vector<grpc::Slice>* s_;
  size_t i_ = 0, pos_ = 0;
};

// One StreamBatchesResponse, with `data` left in place: `data_at` reads its bytes.
struct Message {
  std::optional<v1::StreamStart> start;
  std::optional<v1::BatchHeader> header;
  uint64_t offset = 0;
  uint64_t data_size = 0;
  std::optional<SliceReader> data_at;
  bool last = false;
  bool in_shared_memory = false;  // the payload lies in the client's region (base/shm_layout.h)
  uint64_t shm_position = 0;
  bool payload_striped = false;  // a header whose payload comes on the stripe streams
  uint64_t stripe_batch = 0;     // on a stripe stream: the batch `data` belongs to
};

// False on malformed input (truncated varints or fields, bad wire types, submessages that do not
// parse). Unknown fields are skipped: newer servers may add some.
bool ParseMessage(const std::vector<grpc::Slice>* slices, Message* m);

// Bytes per element of a wire dtype (uint8 and bool 1, float16 and bfloat16 2, float32 and int32
// 4).
uint64_t DTypeBytes(v1::DType t);

// Checks a tensor header of a batch whose payload holds `payload_bytes`: it lies inside the
// payload (no offset + bytes overflow), its shape has at most 32 non-negative dimensions, and
// shape product x dtype size equals its bytes without overflowing 64 bits. The server is not
// trusted: a violation is an error message for DATA_LOSS, never undefined behaviour.
std::optional<std::string> CheckTensor(const v1::TensorHeader& t, uint64_t payload_bytes);

// The wire's cursor, dtype and role as the client's (base/types.h); a dtype or role this client
// does not know reads as uint8 data (CheckTensor has checked its sizes).
Cursor FromProto(const v1::Cursor& c);
DType FromProto(v1::DType t);
TensorRole FromProto(v1::TensorRole r);

}  // namespace conveyor::client::wire
