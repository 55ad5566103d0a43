// Who is on the other end of a call, for a server on a shared node (docs/serving.md "Who may
// connect"): the local user that owns a same-host client's TCP socket, and whether that user may
// use the server.
//
// gRPC's sync API gives a call its peer address ("ipv4:127.0.0.1:51234"), not its socket, so the
// uid comes from the kernel's socket table: the connection's client end is looked up by its exact
// four-tuple through sock_diag (NETLINK_SOCK_DIAG, what `ss -e` uses), which reports the uid that
// created the socket. The lookup sees the server's network namespace only, which is the one whose
// loopback the client must share; a connection from another host or namespace is not found.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace conveyor::server_internal {

// The uid owning the client end of the TCP connection whose client address is `grpc_peer`
// ("ipv4:A.B.C.D:PORT" or "ipv6:[ADDR]:PORT") and whose server end is `server_host`:`server_port`
// on this host. An empty or wildcard `server_host` (0.0.0.0, ::) tries the peer's own address,
// which is the server end's address for every same-host connection the kernel routes. nullopt:
// not a TCP connection of this host and namespace (another host, a closed connection, a unix
// socket), or the kernel would not say.
std::optional<uid_t> LocalPeerUid(const std::string& grpc_peer, const std::string& server_host,
                                  uint16_t server_port);
// The same from /proc/net/tcp{,6}, which LocalPeerUid falls back to where the kernel has no TCP
// sock_diag (a scan of every socket of the namespace, so not the first choice).
std::optional<uid_t> LocalPeerUidFromProc(const std::string& grpc_peer, const std::string& server_host,
                                          uint16_t server_port);

// The local users a loopback server lets in: its own uid and root (who can read its memory
// anyway), the uids listed, and the members (primary or supplementary) of the groups listed.
struct LocalUsers {
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
};
bool LocalUserAllowed(uid_t uid, const LocalUsers& allowed);

// "uid 65534 (nobody)", for errors and logs.
std::string DescribeUid(uid_t uid);

// Sets the mode of the unix socket at `path` (and its group to `gid` when one is given), whatever
// the umask was when it was bound: connecting to a unix socket needs write permission on its
// file, so 0600 admits its owner only, 0660 its group too. Refuses a path that is not a socket.
absl::Status RestrictUnixSocket(const std::string& path, mode_t mode, std::optional<gid_t> gid);

}  // namespace conveyor::server_internal
