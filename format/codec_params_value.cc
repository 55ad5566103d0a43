#include "format/codec_params_value.h"

#include <utility>

#include "conveyor/format/v1/shard.pb.h"

namespace conveyor {

using format::v1::CodecParams;

CodecParamsValue::CodecParamsValue() = default;

CodecParamsValue::CodecParamsValue(const CodecParams& params)
    : params_(std::make_unique<CodecParams>(params)) {}

CodecParamsValue::CodecParamsValue(CodecParams&& params)
    : params_(std::make_unique<CodecParams>(std::move(params))) {}

CodecParamsValue::CodecParamsValue(const CodecParamsValue& other)
    : params_(other.params_ != nullptr ? std::make_unique<CodecParams>(*other.params_) : nullptr) {}

CodecParamsValue::CodecParamsValue(CodecParamsValue&& other) noexcept = default;

CodecParamsValue& CodecParamsValue::operator=(const CodecParamsValue& other) {
  if (this != &other) {
    params_ = other.params_ != nullptr ? std::make_unique<CodecParams>(*other.params_) : nullptr;
  }
  return *this;
}

CodecParamsValue& CodecParamsValue::operator=(CodecParamsValue&& other) noexcept = default;

CodecParamsValue::~CodecParamsValue() = default;

const CodecParams& CodecParamsValue::operator*() const {
  return params_ != nullptr ? *params_ : CodecParams::default_instance();
}

CodecParams& CodecParamsValue::operator*() {
  if (params_ == nullptr) params_ = std::make_unique<CodecParams>();
  return *params_;
}

}  // namespace conveyor
