// CodecParamsValue: a format::v1::CodecParams held by value in the write side's public structs
// (EpisodeData::Stream, MuxedStream) without pulling protobuf into their headers. It is a value,
// copied deeply; `value->width()` reads and `value->set_width(64)` writes through the message,
// which the code doing so gets from "conveyor/format/v1/shard.pb.h" (as with format/format_fwd.h).
#pragma once

#include <memory>

#include "format/format_fwd.h"

namespace conveyor {

class CodecParamsValue {
 public:
  // Empty parameters (every field at its default), as a default-constructed message.
  CodecParamsValue();
  // A copy of `params` (a move when given an rvalue). Implicit, so that a message assigns to one.
  CodecParamsValue(const format::v1::CodecParams& params);  // NOLINT(google-explicit-constructor)
  CodecParamsValue(format::v1::CodecParams&& params);       // NOLINT(google-explicit-constructor)
  CodecParamsValue(const CodecParamsValue& other);
  // A moved-from value reads as empty parameters. Moves allocate nothing and never throw, so a
  // vector of structs holding one moves them when it grows.
  CodecParamsValue(CodecParamsValue&& other) noexcept;
  CodecParamsValue& operator=(const CodecParamsValue& other);
  CodecParamsValue& operator=(CodecParamsValue&& other) noexcept;
  ~CodecParamsValue();

  const format::v1::CodecParams& operator*() const;
  const format::v1::CodecParams* operator->() const { return &**this; }
  format::v1::CodecParams& operator*();
  format::v1::CodecParams* operator->() { return &**this; }

 private:
  // Null until written: reads then see CodecParams::default_instance().
  std::unique_ptr<format::v1::CodecParams> params_;
};

}  // namespace conveyor
