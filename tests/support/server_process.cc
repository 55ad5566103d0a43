#include "tests/support/server_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/test_env.h"

namespace conveyor::testing {
namespace {

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

ServerProcess::ServerProcess(const std::string& cli, std::vector<std::string> args,
                             const std::string& dir, int timeout_s) {
  static int counter = 0;
  const std::string tag = std::to_string(getpid()) + "-" + std::to_string(++counter);
  const std::string ready = dir + "/ready-" + tag;
  log_path_ = dir + "/serve-" + tag + ".log";
  bool has_listen = false;
  for (const std::string& a : args) has_listen = has_listen || a == "--listen";
  std::vector<std::string> argv = {cli, "serve"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (!has_listen) {
    argv.push_back("--listen");
    argv.push_back("127.0.0.1:0");
  }
  argv.push_back("--ready-file");
  argv.push_back(ready);
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(cli.c_str(), cargv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(ready);
    std::string line;
    if (f && std::getline(f, line) && !line.empty()) {
      std::istringstream s(line);
      s >> address_ >> metrics_;
      return;
    }
    if (Poll() != -2) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ServerProcess::~ServerProcess() {
  if (Poll() == -2) Stop(SIGKILL, 10);
}

std::string ServerProcess::log() const { return ReadFile(log_path_); }

int ServerProcess::Poll() {
  if (status_ != -2 || pid_ <= 0) return status_;
  int st = 0;
  const pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) status_ = ExitCode(st);
  return status_;
}

int ServerProcess::Stop(int sig, int timeout_s) {
  if (Poll() != -2) return status_;
  kill(pid_, sig);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Poll() != -2) return status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  int st = 0;
  waitpid(pid_, &st, 0);
  status_ = ExitCode(st);
  return -1;
}

int ServerProcess::CountFds() const {
  int n = 0;
  const std::string path = "/proc/" + std::to_string(pid_) + "/fd";
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

std::string DescribeFds(pid_t pid) {
  std::string out;
  const std::string path = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[256] = {};
      const ssize_t n = readlink((path + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
      out += std::string("  ") + e->d_name + " -> " + (n > 0 ? std::string(target, n) : "?") + "\n";
    }
    closedir(d);
  }
  return out;
}

int ServerProcess::CountThreads() const {
  int n = 0;
  const std::string path = "/proc/" + std::to_string(pid_) + "/task";
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

long ServerProcess::RssBytes() const {
  std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
  std::string key;
  long kb = 0;
  while (f >> key) {
    if (key == "VmRSS:") {
      f >> kb;
      return kb * 1024;
    }
    std::string rest;
    std::getline(f, rest);
  }
  return -1;
}

std::string Capture(const std::string& command, int* exit_code, int timeout_s) {
  const CommandResult r = RunCommand(command + " 2>/dev/null", timeout_s);
  *exit_code = r.exit_code;
  return r.output;
}

}  // namespace conveyor::testing
