#include "server/internal/peer_identity.h"

#include <arpa/inet.h>
#include <grp.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "base/strings.h"

namespace conveyor::server_internal {
namespace {

struct Endpoint {
  int family = 0;  // AF_INET or AF_INET6
  unsigned char addr[16] = {};
  uint16_t port = 0;
};

// "ipv4:127.0.0.1:51234", "ipv6:[::1]:51234" (gRPC percent-encodes the brackets: %5B, %5D).
std::optional<Endpoint> ParsePeer(std::string peer) {
  for (auto [from, to] : {std::pair<const char*, char>{"%5B", '['}, {"%5D", ']'}}) {
    for (size_t at; (at = peer.find(from)) != std::string::npos;) peer.replace(at, 3, 1, to);
  }
  Endpoint e;
  std::string host, port;
  if (peer.rfind("ipv4:", 0) == 0) {
    e.family = AF_INET;
    const size_t colon = peer.rfind(':');
    host = peer.substr(5, colon - 5);
    port = peer.substr(colon + 1);
  } else if (peer.rfind("ipv6:[", 0) == 0) {
    e.family = AF_INET6;
    const size_t close = peer.find(']');
    if (close == std::string::npos || close + 1 >= peer.size() || peer[close + 1] != ':') return std::nullopt;
    host = peer.substr(6, close - 6);
    port = peer.substr(close + 2);
  } else {
    return std::nullopt;
  }
  if (const size_t zone = host.find('%'); zone != std::string::npos) host.resize(zone);
  if (inet_pton(e.family, host.c_str(), e.addr) != 1) return std::nullopt;
  char* end = nullptr;
  const unsigned long p = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p == 0 || p > 65535) return std::nullopt;
  e.port = static_cast<uint16_t>(p);
  return e;
}

// Closes the netlink socket however the lookup ends.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// One exact sock_diag lookup: the socket whose local end is `src` and remote end `dst`.
// *unavailable is set when the kernel could not be asked at all (no sock_diag here).
std::optional<uid_t> SocketUid(const Endpoint& src, const unsigned char* dst_addr, uint16_t dst_port,
                               bool* unavailable) {
  *unavailable = false;
  Fd nl{socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)};
  if (nl.fd < 0) {
    *unavailable = true;
    return std::nullopt;
  }
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;  // not a dump: the one socket of this four-tuple
  msg.req.sdiag_family = static_cast<uint8_t>(src.family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = htons(src.port);
  msg.req.id.idiag_dport = htons(dst_port);
  const size_t len = src.family == AF_INET ? 4 : 16;
  std::memcpy(msg.req.id.idiag_src, src.addr, len);
  std::memcpy(msg.req.id.idiag_dst, dst_addr, len);
  msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(nl.fd, &msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    *unavailable = true;
    return std::nullopt;
  }
  alignas(nlmsghdr) char buf[8192];
  const ssize_t got = recv(nl.fd, buf, sizeof(buf), 0);
  if (got <= 0) {
    *unavailable = true;
    return std::nullopt;
  }
  int n = static_cast<int>(got);
  for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, n);
       h = NLMSG_NEXT(h, n)) {
    if (h->nlmsg_type == NLMSG_ERROR) {
      // ENOENT: no such socket. Anything else: the kernel lacks TCP's sock_diag (no tcp_diag).
      const auto* err = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      *unavailable = h->nlmsg_len >= NLMSG_LENGTH(sizeof(nlmsgerr)) && err->error != -ENOENT;
      return std::nullopt;
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) return std::nullopt;
    if (h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) return std::nullopt;
    const auto* d = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
    // The kernel matched the four-tuple; check it anyway, so that a reply about another socket
    // can never name the user. An IPv4 peer may own a dual-stack IPv6 socket (gRPC's clients
    // do), which the reply gives as the v4-mapped ::ffff:A.B.C.D.
    if (d->id.idiag_sport != htons(src.port) || d->id.idiag_dport != htons(dst_port)) return std::nullopt;
    const auto* got = reinterpret_cast<const unsigned char*>(d->id.idiag_src);
    static constexpr unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const bool same = d->idiag_family == src.family
                          ? std::memcmp(got, src.addr, len) == 0
                          : src.family == AF_INET && d->idiag_family == AF_INET6 &&
                                std::memcmp(got, kMapped, 12) == 0 && std::memcmp(got + 12, src.addr, 4) == 0;
    if (!same) return std::nullopt;
    return static_cast<uid_t>(d->idiag_uid);
  }
  return std::nullopt;
}

// The same lookup through /proc/net/tcp and /proc/net/tcp6 (what `ss` read before sock_diag),
// for a kernel without TCP's sock_diag: a line per socket, "sl local rem st queues timers
// retransmits uid ...", addresses as the kernel's 32-bit words in hex and ports in hex. An IPv4
// client may own a dual-stack socket, listed in tcp6 as ::ffff:A.B.C.D.
std::string ProcAddress(int family, const unsigned char* addr, uint16_t port) {
  std::string out;
  char word[16];
  const int words = family == AF_INET ? 1 : 4;
  for (int i = 0; i < words; ++i) {
    uint32_t w = 0;
    std::memcpy(&w, addr + 4 * i, 4);
    std::snprintf(word, sizeof word, "%08X", w);
    out += word;
  }
  std::snprintf(word, sizeof word, ":%04X", port);
  return out + word;
}

std::optional<uid_t> ProcSocketUid(const Endpoint& src, const unsigned char* dst_addr, uint16_t dst_port) {
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> wanted;  // file, (local, remote)
  if (src.family == AF_INET) {
    wanted.push_back({"/proc/net/tcp", {ProcAddress(AF_INET, src.addr, src.port),
                                        ProcAddress(AF_INET, dst_addr, dst_port)}});
    unsigned char mapped_src[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    unsigned char mapped_dst[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    std::memcpy(mapped_src + 12, src.addr, 4);
    std::memcpy(mapped_dst + 12, dst_addr, 4);
    wanted.push_back({"/proc/net/tcp6", {ProcAddress(AF_INET6, mapped_src, src.port),
                                         ProcAddress(AF_INET6, mapped_dst, dst_port)}});
  } else {
    wanted.push_back({"/proc/net/tcp6", {ProcAddress(AF_INET6, src.addr, src.port),
                                         ProcAddress(AF_INET6, dst_addr, dst_port)}});
  }
  for (const auto& [file, ends] : wanted) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timers, retransmits;
      uint64_t uid = 0;
      if (!(fields >> sl >> local >> remote >> state >> queues >> timers >> retransmits >> uid)) continue;
      if (local == ends.first && remote == ends.second) return static_cast<uid_t>(uid);
    }
  }
  return std::nullopt;
}

// The address the peer reached the listener at, in `server_addr`: the listen host's, or for a
// listener on every address the peer's own (a same-host client reaches it at an address of this
// host, and the kernel gives its socket that same address as source).
void ListenerAddress(const Endpoint& peer, const std::string& server_host, unsigned char server_addr[16]) {
  std::string host = server_host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const bool wildcard = host.empty() || host == "0.0.0.0" || host == "::" ||
                        inet_pton(peer.family, host.c_str(), server_addr) != 1;
  if (wildcard) std::memcpy(server_addr, peer.addr, 16);
}

}  // namespace

std::optional<uid_t> LocalPeerUidFromProc(const std::string& grpc_peer, const std::string& server_host,
                                          uint16_t server_port) {
  std::optional<Endpoint> peer = ParsePeer(grpc_peer);
  if (!peer) return std::nullopt;
  unsigned char server_addr[16] = {};
  ListenerAddress(*peer, server_host, server_addr);
  return ProcSocketUid(*peer, server_addr, server_port);
}

std::optional<uid_t> LocalPeerUid(const std::string& grpc_peer, const std::string& server_host,
                                  uint16_t server_port) {
  std::optional<Endpoint> peer = ParsePeer(grpc_peer);
  if (!peer) return std::nullopt;
  unsigned char server_addr[16] = {};
  ListenerAddress(*peer, server_host, server_addr);
  bool unavailable = false;
  std::optional<uid_t> uid = SocketUid(*peer, server_addr, server_port, &unavailable);
  if (!uid && unavailable) uid = ProcSocketUid(*peer, server_addr, server_port);
  return uid;
}

bool LocalUserAllowed(uid_t uid, const LocalUsers& allowed) {
  if (uid == 0 || uid == geteuid()) return true;
  if (std::find(allowed.uids.begin(), allowed.uids.end(), uid) != allowed.uids.end()) return true;
  if (allowed.gids.empty()) return false;
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return false;
  int n = 64;
  std::vector<gid_t> groups(n);
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    groups.resize(n);
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) return false;
  }
  groups.resize(n);
  for (gid_t g : allowed.gids) {
    if (std::find(groups.begin(), groups.end(), g) != groups.end()) return true;
  }
  return false;
}

std::string DescribeUid(uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return StrCat("uid ", uid, " (", pw.pw_name, ")");
  }
  return StrCat("uid ", uid);
}

absl::Status RestrictUnixSocket(const std::string& path, mode_t mode, std::optional<gid_t> gid) {
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0) {
    return absl::InternalError(StrCat("unix socket ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) return absl::FailedPreconditionError(StrCat(path, " is not a socket"));
  if (gid && chown(path.c_str(), static_cast<uid_t>(-1), *gid) != 0) {
    return absl::PermissionDeniedError(StrCat("cannot give unix socket ", path, " to group ", *gid, ": ",
                                              std::strerror(errno)));
  }
  if (chmod(path.c_str(), mode) != 0) {
    return absl::InternalError(StrCat("cannot restrict unix socket ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace conveyor::server_internal
