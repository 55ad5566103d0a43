// Who holds a TCP port on this host, for the error a server gives when its address is taken:
// the listening socket's inode from /proc/net/tcp{,6}, then the process whose fd points at it
// (readable for the same user, or for root). Empty when it cannot be told.
#pragma once

#include <string>

namespace conveyor::server_internal {

// "pid 1234 (conveyor)" for the process listening on TCP `port`, or "" when none is found.
std::string ListenHolder(int port);

}  // namespace conveyor::server_internal
