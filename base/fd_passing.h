// Passing a file descriptor to another process over a connected Unix socket (SCM_RIGHTS): the
// same-host transport's handoff (base/shm_layout.h). One byte travels with it, so the receiver
// can tell a message from the end of the connection.
#pragma once

namespace conveyor {

// Sends one byte with `fd` attached; false when the socket fails (no SIGPIPE).
bool SendFd(int sock, int fd);
// The descriptor of one such message (close-on-exec), or -1: an error, the end of the
// connection, a timeout (SO_RCVTIMEO), or a byte without a descriptor.
int ReceiveFd(int sock);

}  // namespace conveyor
