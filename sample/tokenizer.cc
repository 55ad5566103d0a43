#include "sample/tokenizer.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "sample/internal/sentencepiece_model.h"
#include "sample/yaml_config.h"

namespace conveyor {

namespace {

using yaml::CheckKeys;
using yaml::ConfigError;

// A text of one sample is never near this; the bound keeps int32 sizes and the packing's
// int32 offsets safe whatever the config says.
constexpr int64_t kMaxTokens = int64_t{1} << 24;

// `model` as the config wrote it, made a path this process can open: absolute stays; relative is
// joined to the config file's folder. A source that is not a file (an inline config) has no
// folder, and a relative path would silently mean the server's working directory: refused.
absl::StatusOr<std::string> ResolveModelPath(std::string_view source, const YAML::Node& n,
                                             std::string_view what, const std::string& model) {
  const std::filesystem::path p(model);
  if (p.is_absolute()) return model;
  std::error_code ec;
  const std::filesystem::path config(source);
  if (!std::filesystem::is_regular_file(config, ec)) {
    return ConfigError(source, n,
                       StrCat(what, ": tokenizer.model '", model,
                              "' is relative, and this config was not read from a file (it came "
                              "inline, e.g. from a client), so it has no folder to be relative to: "
                              "give the model's absolute path on the server"));
  }
  return (config.parent_path() / p).lexically_normal().string();
}

}  // namespace

TextTokenizer::TextTokenizer(TokenizerOptions options, std::string sha256,
                             std::unique_ptr<internal::SentencePieceModel> model)
    : options_(std::move(options)), sha256_(std::move(sha256)), model_(std::move(model)) {}

TextTokenizer::~TextTokenizer() = default;

int TextTokenizer::vocab_size() const { return model_->vocab_size(); }

absl::StatusOr<std::shared_ptr<const TextTokenizer>> TextTokenizer::Load(TokenizerOptions options) {
  const std::string& path = options.model;
  std::ifstream f(path, std::ios::binary);
  std::error_code ec;
  if (!f || std::filesystem::is_directory(path, ec)) {
    return absl::NotFoundError(StrCat("tokenizer model ", path, " cannot be read"));
  }
  std::stringstream bytes;
  bytes << f.rdbuf();
  if (f.bad()) return absl::NotFoundError(StrCat("tokenizer model ", path, " cannot be read"));
  const std::string data = bytes.str();
  if (data.empty()) {
    return absl::InvalidArgumentError(
        StrCat("tokenizer model ", path, " is empty: not a SentencePiece .model file"));
  }
  // Digest and model from the same bytes: what the digest names is what encodes.
  absl::StatusOr<std::unique_ptr<internal::SentencePieceModel>> parsed =
      internal::SentencePieceModel::FromBytes(data);
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument) return parsed.status();
    return absl::InvalidArgumentError(StrCat("tokenizer model ", path, " (", data.size(),
                                             " bytes) is not a SentencePiece model: ",
                                             parsed.status().message()));
  }
  std::unique_ptr<internal::SentencePieceModel> model = *std::move(parsed);
  if (options.add_bos && model->bos_id() < 0) {
    return absl::InvalidArgumentError(StrCat("tokenizer model ", path,
                                             " has no BOS piece (trained with --bos_id=-1): "
                                             "add_bos cannot be honoured"));
  }
  if (options.add_eos && model->eos_id() < 0) {
    return absl::InvalidArgumentError(StrCat("tokenizer model ", path,
                                             " has no EOS piece (trained with --eos_id=-1): "
                                             "add_eos cannot be honoured"));
  }
  return std::shared_ptr<const TextTokenizer>(
      new TextTokenizer(std::move(options), Sha256Hex(data), std::move(model)));
}

absl::StatusOr<std::vector<int32_t>> TextTokenizer::Encode(std::string_view text) const {
  absl::StatusOr<std::vector<int>> encoded = model_->Encode(text);
  if (!encoded.ok()) {
    return absl::InvalidArgumentError(StrCat("tokenizer ", options_.model, " cannot encode the text (",
                                             text.size(), " bytes): ", encoded.status().message()));
  }
  const std::vector<int>& ids = *encoded;
  const int64_t specials = (options_.add_bos ? 1 : 0) + (options_.add_eos ? 1 : 0);
  const int64_t total = static_cast<int64_t>(ids.size()) + specials;
  size_t keep = ids.size();
  if (options_.max_tokens > 0 && total > options_.max_tokens) {
    if (options_.overlong == Overlong::kError) {
      return absl::InvalidArgumentError(StrCat(
          "the text (", text.size(), " bytes) is ", total, " tokens, over tokenizer.max_tokens ",
          options_.max_tokens, " (overlong: truncate cuts it; or raise max_tokens)"));
    }
    keep = static_cast<size_t>(options_.max_tokens - specials);
  }
  std::vector<int32_t> out;
  out.reserve(keep + static_cast<size_t>(specials));
  if (options_.add_bos) out.push_back(model_->bos_id());
  out.insert(out.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep));
  if (options_.add_eos) out.push_back(model_->eos_id());
  return out;
}

absl::Status ParseTokenizer(std::string_view source, const YAML::Node& stream_node,
                            std::string_view what, StreamSpec* s) {
  const YAML::Node n = stream_node["tokenizer"];
  if (!n) return absl::OkStatus();
  const std::string where = StrCat(what, ": tokenizer");
  if (!n.IsMap()) {
    return ConfigError(source, n, StrCat(where, " must be a mapping such as {model: spm.model}"));
  }
  RETURN_IF_ERROR(CheckKeys(source, n, where, {"model", "add_bos", "add_eos", "max_tokens", "overlong"}));
  if (!n["model"] || !n["model"].IsScalar() || n["model"].Scalar().empty()) {
    return ConfigError(source, n, StrCat(where, " needs model: the SentencePiece .model file"));
  }
  TokenizerOptions o;
  ASSIGN_OR_RETURN(o.model, ResolveModelPath(source, n["model"], what, n["model"].Scalar()));
  if (n["add_bos"]) {
    ASSIGN_OR_RETURN(o.add_bos, yaml::Bool(source, n["add_bos"], "add_bos"));
  }
  if (n["add_eos"]) {
    ASSIGN_OR_RETURN(o.add_eos, yaml::Bool(source, n["add_eos"], "add_eos"));
  }
  const int64_t specials = (o.add_bos ? 1 : 0) + (o.add_eos ? 1 : 0);
  if (n["max_tokens"]) {
    ASSIGN_OR_RETURN(o.max_tokens, yaml::Integer(source, n["max_tokens"], "max_tokens",
                                                 std::max<int64_t>(1, specials), kMaxTokens));
  }
  if (n["overlong"]) {
    ASSIGN_OR_RETURN(std::string v, yaml::Word(source, n["overlong"], "overlong", {"error", "truncate"}));
    o.overlong = v == "truncate" ? Overlong::kTruncate : Overlong::kError;
    if (o.max_tokens == 0) {
      return ConfigError(source, n["overlong"], StrCat(where, ": overlong needs max_tokens"));
    }
  }
  absl::StatusOr<std::shared_ptr<const TextTokenizer>> t = TextTokenizer::Load(std::move(o));
  if (!t.ok()) {
    const YAML::Mark mark = n["model"].Mark();
    return absl::Status(t.status().code(), StrCat(source, ":", mark.line + 1, ":", mark.column + 1,
                                                  ": ", what, ": ", t.status().message()));
  }
  s->tokenizer = *std::move(t);
  return absl::OkStatus();
}

std::string TokenizerIdentity(const SampleSpec& spec) {
  std::string out;
  for (const StreamSpec& s : spec.streams) {
    if (s.tokenizer == nullptr) continue;
    StrAppend(&out, "tokenizer ", s.name, " sha256=", s.tokenizer->sha256(),
              " vocab=", s.tokenizer->vocab_size(), "\n");
  }
  return out;
}

}  // namespace conveyor
