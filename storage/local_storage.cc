// The local-disk backend: pread(2) on file descriptors kept open for the file's lifetime.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/strings.h"
#include "storage/storage.h"

namespace conveyor {
namespace {

absl::Status ErrnoStatus(int err, std::string_view what) {
  std::string msg = StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

struct LocalCounters {
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> bytes{0};
};

class LocalFile final : public RandomAccessFile {
 public:
  LocalFile(int fd, uint64_t size, std::string name, LocalCounters* counters)
      : fd_(fd), size_(size), name_(std::move(name)), counters_(counters) {}
  ~LocalFile() override { ::close(fd_); }

  // The modification time in nanoseconds: what changes when the file is rewritten in place.
  std::string version() const override {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return {};
    return StrCat("mtime:", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
  }

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset > size_ || n > size_ - offset) {
      return absl::OutOfRangeError(StrCat(name_, ": read of ", n, " bytes at offset ", offset,
                                                " is past the end of the file (", size_,
                                                " bytes)"));
    }
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, StrCat(name_, ": pread at offset ", offset + done));
      }
      if (r == 0) {
        // The file shrank after it was opened.
        return absl::DataLossError(StrCat(name_, ": file ended at offset ", offset + done,
                                                " while reading ", n, " bytes at offset ", offset,
                                                " (was truncated while open?)"));
      }
      done += static_cast<size_t>(r);
    }
    counters_->reads.fetch_add(1, std::memory_order_relaxed);
    counters_->bytes.fetch_add(n, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }

 private:
  const int fd_;
  const uint64_t size_;
  const std::string name_;
  LocalCounters* counters_;  // owned by the LocalStorage, which outlives its files by contract
};

class LocalStorage final : public Storage {
 public:
  explicit LocalStorage(std::string root) : root_(std::move(root)) {
    if (!root_.empty() && root_.back() != '/') root_.push_back('/');
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(std::string_view relpath) override {
    std::string path = Describe(relpath);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, StrCat("cannot open ", path));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, StrCat("cannot stat ", path));
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(StrCat(path, " is a directory, not a file"));
    }
    return std::make_unique<LocalFile>(fd, static_cast<uint64_t>(st.st_size), std::move(path),
                                       &counters_);
  }

  std::string Describe(std::string_view relpath) const override {
    if (!relpath.empty() && relpath.front() == '/') return std::string(relpath);
    return StrCat(root_, relpath);
  }

  StorageStats stats() const override {
    StorageStats s;
    s.reads = counters_.reads.load();
    s.bytes_read = counters_.bytes.load();
    return s;
  }

 private:
  std::string root_;
  LocalCounters counters_;
};

}  // namespace

std::unique_ptr<Storage> NewLocalStorage(std::string root_dir) {
  return std::make_unique<LocalStorage>(std::move(root_dir));
}

}  // namespace conveyor
