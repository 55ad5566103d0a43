#include "base/cache_dir.h"

#include <fcntl.h>
#include <grp.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace conveyor {
namespace {

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string UserName(uid_t uid) {
  struct passwd pw, *out = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &out) == 0 && out != nullptr) return out->pw_name;
  return "?";
}

bool InGroup(gid_t gid) {
  if (gid == ::getegid()) return true;
  const int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  const int got = ::getgroups(n, groups.data());
  for (int i = 0; i < got; ++i) {
    if (groups[static_cast<size_t>(i)] == gid) return true;
  }
  return false;
}

// The node secret: the whole file, which must be a regular file not readable by every user.
absl::StatusOr<std::string> ReadKey(const std::string& what, const std::string& file, gid_t* gid) {
  Fd fd(::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": cannot open the shared-cache key ", file, ": ", std::strerror(errno),
                     errno == ELOOP ? " (a symbolic link: give the file itself)" : ""));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": the shared-cache key ", file, " is not a regular file"));
  }
  if ((st.st_mode & S_IROTH) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": the shared-cache key ", file, " is readable by every user (mode ", Octal(st.st_mode),
                     "); it must be readable only by the group that shares the cache (chmod 0640)"));
  }
  if (st.st_size < 32 || st.st_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the shared-cache key ", file, " has ", st.st_size,
                     " bytes; give 32 to 4096 random bytes (head -c 32 /dev/urandom > KEY)"));
  }
  std::string key(static_cast<size_t>(st.st_size), '\0');
  if (!ReadFull(fd.get(), key.data(), key.size(), 0)) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": cannot read the shared-cache key ", file, ": ", std::strerror(errno)));
  }
  *gid = st.st_gid;
  return key;
}

}  // namespace

CacheDir::~CacheDir() {
  if (!key_.empty()) OPENSSL_cleanse(key_.data(), key_.size());
}

absl::StatusOr<std::unique_ptr<CacheDir>> CacheDir::Open(const CacheDirOptions& options) {
  const std::string& what = options.what;
  if (options.path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  std::unique_ptr<CacheDir> d(new CacheDir());
  d->path_ = options.path;
  d->what_ = what;
  gid_t key_gid = 0;
  if (!options.key_file.empty()) {
    auto key = ReadKey(absl::StrCat(what, " ", options.path), options.key_file, &key_gid);
    if (!key.ok()) return key.status();
    d->key_ = std::move(*key);
  }
  const std::string& path = d->path_;
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);  // mkdir below reports
  const bool created = ::mkdir(path.c_str(), d->dir_mode()) == 0;
  if (!created && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", path, ": cannot create it: ", std::strerror(errno)));
  }
  d->dir_ = Fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!d->dir_.ok()) {
    const int e = errno;
    return absl::PermissionDeniedError(absl::StrCat(
        what, " ", path, ": cannot open it: ", std::strerror(e),
        e == ELOOP || e == ENOTDIR ? " (a symbolic link or not a directory: refusing to follow it)" : ""));
  }
  const int fd = d->dir_.get();
  const uid_t me = ::geteuid();
  if (created && d->shared()) {
    // The group of the secret is the group that shares the cache; setgid so that what any member
    // creates inside belongs to it too. (The umask may have removed the group's bits.)
    if (::fchown(fd, static_cast<uid_t>(-1), key_gid) != 0 || ::fchmod(fd, d->dir_mode()) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(what, " ", path, ": cannot give it group ", key_gid,
                                                      " (the key file's): ", std::strerror(errno)));
    }
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", path, ": cannot stat it: ", std::strerror(errno)));
  }
  const std::string how = " (docs/serving.md \"Shared nodes\")";
  if (!d->shared()) {
    if (st.st_uid != me) {
      return absl::PermissionDeniedError(absl::StrCat(
          what, " ", path, " is owned by uid ", st.st_uid, " (", UserName(st.st_uid), "), not by this process's uid ",
          me, " (", UserName(me), "): refusing a private cache another user could write or read; use a directory of "
          "your own, or share one explicitly with a shared-cache key", how));
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          what, " ", path, " is group- or world-writable (mode ", Octal(st.st_mode),
          "): refusing a private cache others could write; chmod 0700 it, or share it explicitly with a "
          "shared-cache key", how));
    }
    if ((st.st_mode & 077) != 0 && ::fchmod(fd, 0700) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, " ", path, ": cannot make it private (chmod 0700): ", std::strerror(errno)));
    }
  } else {
    if ((st.st_mode & S_IWOTH) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          what, " ", path, " is world-writable (mode ", Octal(st.st_mode),
          "): a shared cache is shared by one group; chmod 2770 it and give it that group", how));
    }
    if (::faccessat(fd, ".", W_OK | X_OK, AT_EACCESS) != 0) {
      return absl::PermissionDeniedError(absl::StrCat(what, " ", path, " (group ", st.st_gid, ", mode ",
                                                      Octal(st.st_mode), ") is not writable by this process: ",
                                                      InGroup(st.st_gid) ? "give the group write permission"
                                                                         : "this process is not in its group",
                                                      how));
    }
    d->gid_ = st.st_gid;
  }
  return d;
}

Fd CacheDir::OpenDir(std::string_view rel, bool create) const {
  Fd cur(::fcntl(dir_.get(), F_DUPFD_CLOEXEC, 0));
  while (!rel.empty()) {
    const size_t slash = rel.find('/');
    const std::string_view part = rel.substr(0, slash);
    rel = slash == std::string_view::npos ? std::string_view() : rel.substr(slash + 1);
    if (part.empty()) continue;
    if (!cur.ok()) return cur;
    if (part == "." || part == "..") {
      errno = EINVAL;
      return Fd();
    }
    const std::string name(part);
    constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    Fd next(::openat(cur.get(), name.c_str(), kFlags));
    if (!next.ok() && errno == ENOENT && create) {
      if (::mkdirat(cur.get(), name.c_str(), dir_mode()) != 0 && errno != EEXIST) return Fd();
      next = Fd(::openat(cur.get(), name.c_str(), kFlags));
      struct stat st;
      if (next.ok() && shared() && ::fstat(next.get(), &st) == 0 && st.st_uid == ::geteuid()) {
        ::fchmod(next.get(), dir_mode());  // the umask may have taken the group's write bit
      }
    }
    cur = std::move(next);
  }
  return cur;
}

Fd CacheDir::OpenFile(int dirfd, const std::string& name, int flags, bool create) const {
  Fd fd(::openat(dirfd, name.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (create ? O_CREAT : 0),
                 lock_mode()));
  if (!fd.ok()) return fd;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Fd();
  if (!S_ISREG(st.st_mode)) {
    errno = EINVAL;
    return Fd();
  }
  if (!shared() && st.st_uid != ::geteuid()) {
    errno = EPERM;
    return Fd();
  }
  if (create && shared() && st.st_uid == ::geteuid() && (st.st_mode & 07777) != lock_mode()) {
    ::fchown(fd.get(), static_cast<uid_t>(-1), gid_);
    ::fchmod(fd.get(), lock_mode());
  }
  // Back to blocking reads and writes (O_NONBLOCK was for the open alone: a regular file ignores it).
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

Fd CacheDir::CreateTemp(int dirfd, std::string* name) const {
  for (int attempt = 0; attempt < 16; ++attempt) {
    uint8_t r[12];
    if (::getrandom(r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) return Fd();
    char hex[2 * sizeof r + 1];
    for (size_t i = 0; i < sizeof r; ++i) std::snprintf(hex + 2 * i, 3, "%02x", r[i]);
    *name = absl::StrCat("t.", hex);
    Fd fd(::openat(dirfd, name->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, file_mode()));
    if (!fd.ok() && errno == EEXIST) continue;
    if (fd.ok() && shared()) {
      ::fchown(fd.get(), static_cast<uid_t>(-1), gid_);
      ::fchmod(fd.get(), file_mode());  // the umask may have taken the group's read bit
    }
    return fd;
  }
  errno = EEXIST;
  return Fd();
}

std::optional<std::string> CacheDir::ReadEntry(const std::string& name, uint64_t max_bytes) const {
  Fd fd = OpenFile(dir_.get(), name, O_RDONLY);
  struct stat st;
  if (!fd.ok() || ::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) > max_bytes) return std::nullopt;
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  if (!bytes.empty() && !ReadFull(fd.get(), bytes.data(), bytes.size(), 0)) return std::nullopt;
  return bytes;
}

bool CacheDir::WriteEntry(const std::string& name, std::string_view bytes) const {
  std::string tmp;
  Fd fd = CreateTemp(dir_.get(), &tmp);
  if (!fd.ok()) return false;
  if ((!bytes.empty() && !WriteFull(fd.get(), bytes.data(), bytes.size(), 0)) ||
      ::renameat(dir_.get(), tmp.c_str(), dir_.get(), name.c_str()) != 0) {
    const int e = errno;
    ::unlinkat(dir_.get(), tmp.c_str(), 0);
    errno = e;
    return false;
  }
  return true;
}

bool CacheDir::Mac(std::initializer_list<std::string_view> parts, CacheMac* out) const {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = mac != nullptr ? EVP_MAC_CTX_new(mac) : nullptr;
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  bool ok = ctx != nullptr &&
            EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key_.data()), key_.size(), params) == 1;
  for (std::string_view p : parts) {
    uint8_t len[8];
    const uint64_t n = p.size();
    std::memcpy(len, &n, 8);
    ok = ok && EVP_MAC_update(ctx, len, 8) == 1 &&
         EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(p.data()), p.size()) == 1;
  }
  size_t got = 0;
  ok = ok && EVP_MAC_final(ctx, out->data(), &got, out->size()) == 1 && got == out->size();
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return ok;
}

bool CacheDir::MacEqual(const CacheMac& a, const uint8_t* b) { return CRYPTO_memcmp(a.data(), b, a.size()) == 0; }

}  // namespace conveyor
