// A text stream's tokenizer: a SentencePiece model (Debian's libsentencepiece) named in the sample
// spec, so captions and instructions reach the trainer as token ids, and packing counts real
// tokens (docs/sampling.md "Tokenized text"):
//
//   streams:
//     caption:
//       tokenizer: {model: spm.model, add_bos: true, add_eos: true, max_tokens: 128,
//                   overlong: error}
//
// The tensor is int32 [n] (n varies per sample; batches pad it with zeros and add the bool
// `<name>_mask`, as for raw text). The ids are SentencePiece's Encode of the text with the model's
// own normalization and no sampling: python3-sentencepiece's `encode(text)` (tests/tokenizer_test.cc
// checks them id for id), with the BOS id first and the EOS id last when asked.
//
// SentencePiece runs in a module loaded at run time (internal/sentencepiece_model.h says why and
// where it is looked for). The model is read once per spec, its bytes hashed (SHA-256) and parsed from the same bytes, and
// shared by every worker (SentencePiece's Encode is thread-safe). The hash is part of the config's
// digest and order digest (TokenizerIdentity), so a job resumed against another model is refused
// rather than continued on other ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sample/sample_spec.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace conveyor {

namespace internal {
class SentencePieceModel;
}  // namespace internal

// What happens to a text whose ids (BOS and EOS included) are more than max_tokens.
enum class Overlong {
  // The sample is an error (INVALID_ARGUMENT naming the stream, its token count and the limit;
  // `on_error: skip` skips it, counted and logged like any failed sample). The default: nothing
  // is dropped unless the config says so.
  kError,
  // The text's ids are cut to max_tokens - (BOS + EOS); BOS and EOS are kept, so the tensor still
  // ends in EOS (what Hugging Face tokenizers' truncation does).
  kTruncate,
};

struct TokenizerOptions {
  std::string model;      // the model file, resolved: absolute, or relative to the process
  bool add_bos = false;   // prepend the model's BOS id (the model must have one)
  bool add_eos = false;   // append the model's EOS id (the model must have one)
  int64_t max_tokens = 0; // 0: no limit (the sample's max_sample_bytes still bounds it)
  Overlong overlong = Overlong::kError;
};

// Thread-safe: every method is const.
class TextTokenizer {
 public:
  // Reads and parses the model at options.model. NOT_FOUND when it cannot be read,
  // INVALID_ARGUMENT when it is not a SentencePiece model or lacks a BOS/EOS piece asked for
  // (each names the path), FAILED_PRECONDITION when the SentencePiece module is not found.
  static absl::StatusOr<std::shared_ptr<const TextTokenizer>> Load(TokenizerOptions options);
  ~TextTokenizer();

  // The ids of `text` as the options say. Overlong::kError: INVALID_ARGUMENT naming the count.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;

  const TokenizerOptions& options() const { return options_; }
  const std::string& sha256() const { return sha256_; }  // of the model file's bytes, hex
  int vocab_size() const;

 private:
  TextTokenizer(TokenizerOptions options, std::string sha256,
                std::unique_ptr<internal::SentencePieceModel> model);
  TokenizerOptions options_;
  std::string sha256_;
  std::unique_ptr<internal::SentencePieceModel> model_;
};

// A text stream's `tokenizer:` key (in `stream_node`, a stream's mapping), if present: checks its
// keys and loads the model into s->tokenizer. A relative `model` is relative to the folder of the
// config file `source` names; a config that is not a file (sent inline by a client, built in
// code) must give an absolute path, since its folder is unknown. Errors are INVALID_ARGUMENT
// "source:line:col: ..." (NOT_FOUND for an unreadable model), naming the stream and the path.
absl::Status ParseTokenizer(std::string_view source, const YAML::Node& stream_node,
                            std::string_view what, StreamSpec* s);

// What of the files a spec names decides its samples' bits beyond the config's text: one line
// per tokenized stream, "tokenizer STREAM sha256=HEX vocab=N". Empty when no stream has a
// tokenizer, so the digests of configs without one are what they were. The server folds it into
// the config digest and the order digest (pipeline/order_digest.h).
std::string TokenizerIdentity(const SampleSpec& spec);

}  // namespace conveyor
