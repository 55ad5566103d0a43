// A real `conveyor serve` process for end-to-end tests: started with --listen 127.0.0.1:0 and
// --ready-file, so tests learn the bound address; stopped with SIGTERM (or killed with SIGKILL to
// simulate a crash). Its stderr goes to a log file that failures print.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace conveyor::testing {

class ServerProcess {
 public:
  // Starts `cli serve ARGS... --listen 127.0.0.1:0 --ready-file ...` (unless ARGS give --listen)
  // and waits up to `timeout_s` for it to be ready. ok() is false (and log() says why) if it
  // exited or timed out.
  ServerProcess(const std::string& cli, std::vector<std::string> args, const std::string& dir,
                int timeout_s = 60);
  ~ServerProcess();  // SIGKILL if still running
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool ok() const { return !address_.empty(); }
  const std::string& address() const { return address_; }          // 127.0.0.1:PORT
  const std::string& metrics_address() const { return metrics_; }  // empty unless asked for
  pid_t pid() const { return pid_; }
  std::string log() const;

  // Sends `sig` and waits up to `timeout_s` for the exit; returns the exit status (128 + signal
  // when killed by one), or -1 on timeout (then it is SIGKILLed).
  int Stop(int sig, int timeout_s = 30);
  // Exit status if it has exited, else -2 (non-blocking).
  int Poll();

  // From /proc: open file descriptors, threads, resident set size (bytes).
  int CountFds() const;
  int CountThreads() const;
  long RssBytes() const;

 private:
  pid_t pid_ = -1;
  int status_ = -2;
  std::string address_, metrics_, log_path_;
};

// Every open file descriptor of `pid` and what it points at (socket:[...], anon_inode:...).
std::string DescribeFds(pid_t pid);

// Runs a command and returns its stdout (stderr to the same log), or "" with *exit_code set.
std::string Capture(const std::string& command, int* exit_code, int timeout_s = 300);

}  // namespace conveyor::testing
