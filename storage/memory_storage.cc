#include "storage/memory_storage.h"

#include <atomic>
#include <cstring>

#include "base/strings.h"

namespace conveyor {
namespace {

class MemoryFile final : public RandomAccessFile {
 public:
  MemoryFile(std::shared_ptr<const std::string> bytes, std::string name,
             std::optional<uint64_t> fail_at, std::atomic<uint64_t>* reads,
             std::atomic<uint64_t>* bytes_read)
      : bytes_(std::move(bytes)), name_(std::move(name)), fail_at_(fail_at), reads_(reads),
        bytes_read_(bytes_read) {}

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset > bytes_->size() || n > bytes_->size() - offset) {
      return absl::OutOfRangeError(StrCat(name_, ": read of ", n, " bytes at offset ", offset,
                                          " is past the end of the file (", bytes_->size(),
                                          " bytes)"));
    }
    if (fail_at_ && *fail_at_ >= offset && *fail_at_ < offset + n) {
      return absl::UnavailableError(StrCat(name_, ": injected failure at byte ", *fail_at_));
    }
    if (n > 0) std::memcpy(dst, bytes_->data() + offset, n);
    reads_->fetch_add(1, std::memory_order_relaxed);
    bytes_read_->fetch_add(n, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  uint64_t size() const override { return bytes_->size(); }
  const std::string& name() const override { return name_; }

 private:
  std::shared_ptr<const std::string> bytes_;
  std::string name_;
  std::optional<uint64_t> fail_at_;
  std::atomic<uint64_t>* reads_;
  std::atomic<uint64_t>* bytes_read_;
};

class MemoryStorage final : public Storage {
 public:
  MemoryStorage(std::map<std::string, std::string> files, MemoryStorageOptions options)
      : fail_at_(options.fail_at_offset) {
    for (auto& [path, bytes] : files) {
      files_.emplace(path, std::make_shared<const std::string>(std::move(bytes)));
    }
    if (options.any_other_file) {
      other_ = std::make_shared<const std::string>(std::move(*options.any_other_file));
    }
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(std::string_view relpath) override {
    while (!relpath.empty() && relpath.front() == '/') relpath.remove_prefix(1);
    auto it = files_.find(std::string(relpath));
    std::shared_ptr<const std::string> bytes = it != files_.end() ? it->second : other_;
    if (!bytes) return absl::NotFoundError(StrCat(Describe(relpath), " does not exist"));
    return std::make_unique<MemoryFile>(bytes, Describe(relpath), fail_at_, &reads_, &bytes_read_);
  }

  std::string Describe(std::string_view relpath) const override {
    // A scheme with "://": not a local folder to list or stat (datasets/internal/format_util.h LocalRoot).
    return StrCat("mem://", relpath);
  }

  StorageStats stats() const override {
    StorageStats s;
    s.reads = reads_.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::map<std::string, std::shared_ptr<const std::string>> files_;
  std::shared_ptr<const std::string> other_;
  std::optional<uint64_t> fail_at_;
  std::atomic<uint64_t> reads_{0}, bytes_read_{0};
};

}  // namespace

std::unique_ptr<Storage> NewMemoryStorage(std::map<std::string, std::string> files,
                                          MemoryStorageOptions options) {
  return std::make_unique<MemoryStorage>(std::move(files), std::move(options));
}

}  // namespace conveyor
