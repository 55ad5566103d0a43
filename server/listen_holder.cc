#include "server/internal/listen_holder.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace conveyor::server_internal {
namespace {

// The inode of the socket listening (state 0A) on local port `port`, or "".
std::string ListeningInode(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      if (!(f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
      const size_t colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) return inode;
    }
  }
  return "";
}

}  // namespace

std::string ListenHolder(int port) {
  const std::string inode = ListeningInode(port);
  if (inode.empty() || inode == "0") return "";
  const std::string want = "socket:[" + inode + "]";
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return "";
  std::string found;
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const std::string fd_dir = std::string("/proc/") + e->d_name + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    while (dirent* f = readdir(fds)) {
      char target[256];
      const std::string link = fd_dir + "/" + f->d_name;
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      if (want == target) {
        std::ifstream comm(std::string("/proc/") + e->d_name + "/comm");
        std::string name;
        std::getline(comm, name);
        found = std::string("pid ") + e->d_name + " (" + name + ")";
        break;
      }
    }
    closedir(fds);
    if (!found.empty()) break;
  }
  closedir(proc);
  return found;
}

}  // namespace conveyor::server_internal
