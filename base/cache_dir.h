// CacheDir: a node cache's directory, safe on a node shared by several users (docs/serving.md
// "Shared nodes"). Used by the byte cache (storage/caching_storage.cc) and the decoded-frame store
// (pipeline/frame_store.cc).
//
// Two modes:
// - Private (the default): the directory belongs to this process's uid and no one else may write
//   in it. Open creates it 0700, or accepts an existing one only when it is owned by this uid and
//   not group- or world-writable (a readable one is tightened to 0700), so a directory planted by
//   another user in /dev/shm or /tmp is refused with its path and owner. Entries are 0600.
// - Shared (`key_file` given): a directory several users or jobs share through a group. It must
//   not be world-writable and this process must be able to write in it (as a member of its group);
//   when Open creates it, it is 02770 with the key file's group. Every entry is authenticated with
//   HMAC-SHA256 under the node secret in `key_file` (readable by that group, not by every user), so
//   an entry written by anyone without the secret is never a hit. Entries are 0640, lock and
//   account files 0660.
//
// In both modes every open refuses to follow a symbolic link (O_NOFOLLOW on every component under
// the directory) and refuses anything but a regular file (fstat after an O_NONBLOCK open, so a
// planted FIFO neither blocks nor is read); temporary files have unpredictable names and are
// created with O_EXCL, never truncated. In private mode a file must also be owned by this uid.
//
// Thread-safe after Open (the object is constant).
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/posix_file.h"

namespace conveyor {

struct CacheDirOptions {
  std::string path;      // created when missing (its parents with the default mode)
  std::string what;      // for messages: "frame cache directory", "storage cache"
  std::string key_file;  // empty: private; else shared, authenticated with this node secret
};

using CacheMac = std::array<uint8_t, 32>;

class CacheDir {
 public:
  // PERMISSION_DENIED naming the path (and its owner or mode) when the directory or the key file
  // fails a check; INVALID_ARGUMENT for an empty path or a key shorter than 32 bytes.
  static absl::StatusOr<std::unique_ptr<CacheDir>> Open(const CacheDirOptions& options);
  ~CacheDir();
  CacheDir(const CacheDir&) = delete;
  CacheDir& operator=(const CacheDir&) = delete;

  const std::string& path() const { return path_; }
  bool shared() const { return !key_.empty(); }
  int fd() const { return dir_.get(); }
  mode_t file_mode() const { return shared() ? 0640 : 0600; }

  // The directory `rel` under this one ('/'-separated, no "." or ".."; "" is this one), opened
  // without following a symbolic link at any component; missing components are created when
  // `create`. An invalid Fd (errno set) when it cannot be opened.
  Fd OpenDir(std::string_view rel, bool create) const;
  // The regular file `name` in directory `dirfd` for reading (`flags` O_RDONLY) or reading and
  // writing (O_RDWR, with `create`: created when missing, mode lock_mode()). An invalid Fd, errno
  // ELOOP for a symbolic link, EINVAL for anything but a regular file (a FIFO, a device), EPERM
  // for a file of another uid in private mode.
  Fd OpenFile(int dirfd, const std::string& name, int flags, bool create = false) const;
  // A new empty file in `dirfd` with an unpredictable name (returned in *name), mode file_mode().
  Fd CreateTemp(int dirfd, std::string* name) const;
  // Whole-file entries directly in this directory (the index sidecars): the regular file `name`
  // (no '/') if it passes OpenFile's checks and has at most `max_bytes`; nullopt otherwise.
  std::optional<std::string> ReadEntry(const std::string& name, uint64_t max_bytes) const;
  // Writes `bytes` as `name`: to a CreateTemp name, then renamed over it. False (errno set) when
  // it cannot.
  bool WriteEntry(const std::string& name, std::string_view bytes) const;
  // HMAC-SHA256 of the parts (each length-prefixed, so parts cannot be shifted into each other)
  // under the node secret, into *out. False when libcrypto fails (out of memory): the caller
  // treats the entry as unwritable or as a miss, never as a hit. REQUIRES: shared().
  bool Mac(std::initializer_list<std::string_view> parts, CacheMac* out) const;
  // Constant-time comparison of two MACs.
  static bool MacEqual(const CacheMac& a, const uint8_t* b);

 private:
  CacheDir() = default;
  mode_t lock_mode() const { return shared() ? 0660 : 0600; }
  mode_t dir_mode() const { return shared() ? 02770 : 0700; }

  std::string path_;
  std::string what_;
  Fd dir_;
  std::string key_;  // the node secret; empty: private
  gid_t gid_ = 0;    // shared: the directory's group, given to what this process creates
};

}  // namespace conveyor
