// SentencePiece, loaded at run time: the module libconveyor_sentencepiece.so
// (internal/sentencepiece_shim.cc, where the reason is) opened once per process with
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND), its C functions called through pointers. Found, first
// that exists: $CONVEYOR_SENTENCEPIECE_MODULE, the build tree's module (this build's programs
// and tests), then ../lib/conveyor/ beside the running executable (an installed tree).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::internal {

struct SentencePieceModule;

// One loaded model. Encode is const and thread-safe (SentencePieceProcessor::Encode is), so one
// instance serves every worker.
class SentencePieceModel {
 public:
  // Parses a model file's bytes (a serialized ModelProto). FAILED_PRECONDITION when the module
  // cannot be loaded (naming where it looked), INVALID_ARGUMENT with SentencePiece's message when
  // the bytes are not a model.
  static absl::StatusOr<std::unique_ptr<SentencePieceModel>> FromBytes(const std::string& bytes);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // The ids of `text` (the model's normalization, no sampling, no BOS/EOS).
  absl::StatusOr<std::vector<int>> Encode(std::string_view text) const;
  int bos_id() const { return bos_; }  // -1: the model has no BOS piece
  int eos_id() const { return eos_; }  // -1: the model has no EOS piece
  int vocab_size() const { return vocab_; }

 private:
  SentencePieceModel(const SentencePieceModule* module, void* handle);
  const SentencePieceModule* module_;
  void* handle_;
  int bos_ = -1, eos_ = -1, vocab_ = 0;
};

}  // namespace conveyor::internal
