#include "sample/internal/sentencepiece_model.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "base/strings.h"

namespace conveyor::internal {

// The module's C functions (internal/sentencepiece_shim.cc).
struct SentencePieceModule {
  void* (*load)(const char* bytes, size_t size, char* error, size_t error_len) = nullptr;
  void (*free)(void* model) = nullptr;
  int (*encode)(const void* model, const char* text, size_t size, int** ids, size_t* count,
                char* error, size_t error_len) = nullptr;
  void (*info)(const void* model, int* bos, int* eos, int* vocab) = nullptr;
};

namespace {

constexpr size_t kErrorLen = 512;

// Where the module may be, in the order tried.
std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("CONVEYOR_SENTENCEPIECE_MODULE"); env != nullptr && *env) {
    out.push_back(env);
  }
  out.push_back(CONVEYOR_SENTENCEPIECE_MODULE_BUILT);
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // In a build tree this is the build's module again: listed once.
    const std::string installed =
        (exe.parent_path() / ".." / "lib" / "conveyor" / "libconveyor_sentencepiece.so")
            .lexically_normal()
            .string();
    if (installed != out.back()) out.push_back(installed);
  }
  return out;
}

// Loaded once per process and kept for its life (models point into it); or why it was not.
absl::StatusOr<const SentencePieceModule*> Module() {
  static std::once_flag once;
  static const SentencePieceModule* loaded = nullptr;
  static std::string tried;
  std::call_once(once, [] {
    for (const std::string& path : Candidates()) {
      std::error_code ec;
      if (!std::filesystem::exists(path, ec)) {
        StrAppend(&tried, tried.empty() ? "" : "; ", path, ": absent");
        continue;
      }
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h == nullptr) {
        StrAppend(&tried, tried.empty() ? "" : "; ", path, ": ", dlerror());
        continue;
      }
      auto* m = new SentencePieceModule();
      m->load = reinterpret_cast<decltype(m->load)>(dlsym(h, "conveyor_spm_load"));
      m->free = reinterpret_cast<decltype(m->free)>(dlsym(h, "conveyor_spm_free"));
      m->encode = reinterpret_cast<decltype(m->encode)>(dlsym(h, "conveyor_spm_encode"));
      m->info = reinterpret_cast<decltype(m->info)>(dlsym(h, "conveyor_spm_info"));
      if (!m->load || !m->free || !m->encode || !m->info) {
        StrAppend(&tried, tried.empty() ? "" : "; ", path, ": lacks the conveyor_spm_ functions");
        delete m;
        dlclose(h);
        continue;
      }
      loaded = m;
      return;
    }
  });
  if (loaded != nullptr) return loaded;
  return absl::FailedPreconditionError(
      StrCat("the SentencePiece module libconveyor_sentencepiece.so cannot be loaded (", tried,
             "); set CONVEYOR_SENTENCEPIECE_MODULE to its path"));
}

}  // namespace

SentencePieceModel::SentencePieceModel(const SentencePieceModule* module, void* handle)
    : module_(module), handle_(handle) {
  module_->info(handle_, &bos_, &eos_, &vocab_);
}

SentencePieceModel::~SentencePieceModel() { module_->free(handle_); }

absl::StatusOr<std::unique_ptr<SentencePieceModel>> SentencePieceModel::FromBytes(
    const std::string& bytes) {
  absl::StatusOr<const SentencePieceModule*> m = Module();
  if (!m.ok()) return m.status();
  char error[kErrorLen] = {0};
  void* handle = (*m)->load(bytes.data(), bytes.size(), error, sizeof(error));
  if (handle == nullptr) return absl::InvalidArgumentError(error);
  return std::unique_ptr<SentencePieceModel>(new SentencePieceModel(*m, handle));
}

absl::StatusOr<std::vector<int>> SentencePieceModel::Encode(std::string_view text) const {
  int* ids = nullptr;
  size_t count = 0;
  char error[kErrorLen] = {0};
  if (module_->encode(handle_, text.data(), text.size(), &ids, &count, error, sizeof(error)) != 0) {
    return absl::InvalidArgumentError(error);
  }
  std::vector<int> out(ids, ids + count);
  std::free(ids);
  return out;
}

}  // namespace conveyor::internal
