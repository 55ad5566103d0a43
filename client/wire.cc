#include "client/internal/wire.h"

#include <algorithm>
#include <cstring>

namespace conveyor::client::wire {

SliceReader::SliceReader(const std::vector<grpc::Slice>* slices) : s_(slices) { Settle(); }

bool SliceReader::Varint(uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b;
    if (!Byte(&b)) return false;
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

bool SliceReader::Copy(uint8_t* dst, uint64_t n) {
  while (n > 0) {
    if (eof()) return false;
    const grpc::Slice& sl = (*s_)[i_];
    const size_t k = std::min<uint64_t>(n, sl.size() - pos_);
    std::memcpy(dst, sl.begin() + pos_, k);
    dst += k;
    n -= k;
    pos_ += k;
    Settle();
  }
  return true;
}

bool SliceReader::Skip(uint64_t n) {
  while (n > 0) {
    if (eof()) return false;
    const size_t k = std::min<uint64_t>(n, (*s_)[i_].size() - pos_);
    n -= k;
    pos_ += k;
    Settle();
  }
  return true;
}

bool SliceReader::String(uint64_t n, std::string* out) {
  if (n > (64u << 20)) return false;
  out->resize(n);
  return Copy(reinterpret_cast<uint8_t*>(out->data()), n);
}

bool SliceReader::Byte(uint8_t* b) {
  if (eof()) return false;
  *b = (*s_)[i_].begin()[pos_++];
  Settle();
  return true;
}

void SliceReader::Settle() {
  while (i_ < s_->size() && pos_ >= (*s_)[i_].size()) {
    ++i_;
    pos_ = 0;
  }
}

// Parses the wire format by hand so that the payload is copied once, straight from gRPC's
// receive slices into the batch block. Unknown fields are skipped (newer servers may add some).
bool ParseMessage(const std::vector<grpc::Slice>* slices, Message* m) {
  SliceReader r(slices);
  while (!r.eof()) {
    uint64_t tag = 0, v = 0;
    if (!r.Varint(&tag)) return false;
    const uint64_t field = tag >> 3, wire = tag & 7;
    if (wire == 2) {
      uint64_t n = 0;
      if (!r.Varint(&n)) return false;
      if (field == 1 || field == 2) {
        std::string bytes;
        if (!r.String(n, &bytes)) return false;
        if (field == 1 && !m->start.emplace().ParseFromString(bytes)) return false;
        if (field == 2 && !m->header.emplace().ParseFromString(bytes)) return false;
      } else if (field == 4) {
        m->data_size = n;
        m->data_at.emplace(r);
        if (!r.Skip(n)) return false;
      } else if (!r.Skip(n)) {
        return false;
      }
    } else if (wire == 0) {
      if (!r.Varint(&v)) return false;
      if (field == 3) m->offset = v;
      if (field == 5) m->last = v != 0;
      if (field == 6) m->in_shared_memory = v != 0;
      if (field == 7) m->shm_position = v;
      if (field == 8) m->payload_striped = v != 0;
      if (field == 9) m->stripe_batch = v;
    } else if (wire == 1) {
      if (!r.Skip(8)) return false;
    } else if (wire == 5) {
      if (!r.Skip(4)) return false;
    } else {
      return false;
    }
  }
  return true;
}


uint64_t DTypeBytes(v1::DType t) {
  switch (t) {
    case v1::FLOAT32:
    case v1::INT32: return 4;
    case v1::FLOAT16:
    case v1::BFLOAT16: return 2;
    default: return 1;
  }
}

std::optional<std::string> CheckTensor(const v1::TensorHeader& t, uint64_t payload_bytes) {
  uint64_t end = 0;
  if (__builtin_add_overflow(t.offset(), t.bytes(), &end) || end > payload_bytes) {
    return "lies outside its batch payload";
  }
  if (t.shape_size() > 32) return "has more than 32 dimensions";
  uint64_t elements = 1;
  for (int64_t d : t.shape()) {
    if (d < 0) return "has a negative dimension";
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
      return "has a shape whose product overflows 64 bits";
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elements, DTypeBytes(t.dtype()), &bytes) || bytes != t.bytes()) {
    return "has a byte count that does not match its shape";
  }
  return std::nullopt;
}

DType FromProto(v1::DType t) {
  switch (t) {
    case v1::BOOL: return DType::kBool;
    case v1::FLOAT32: return DType::kFloat32;
    case v1::INT32: return DType::kInt32;
    case v1::FLOAT16: return DType::kFloat16;
    case v1::BFLOAT16: return DType::kBFloat16;
    default: return DType::kUint8;
  }
}

Cursor FromProto(const v1::Cursor& c) {
  Cursor out{c.epoch(), c.step()};
  if (c.has_position()) out.position = c.position();
  return out;
}

TensorRole FromProto(v1::TensorRole r) {
  switch (r) {
    case v1::PADDING_MASK: return TensorRole::kPaddingMask;
    case v1::SEGMENT_IDS: return TensorRole::kSegmentIds;
    case v1::POSITIONS: return TensorRole::kPositions;
    case v1::SAMPLE_INFO: return TensorRole::kSampleInfo;
    default: return TensorRole::kData;
  }
}

}  // namespace conveyor::client::wire
