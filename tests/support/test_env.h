// Small helpers shared by tests: scratch directories, running commands, writing files.
#pragma once

#include <string>
#include <vector>

namespace conveyor::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;  // -1 when the command could not be run or was killed by a signal
  std::string output;  // stdout and stderr together
};

// Runs `command` through /bin/sh with a time limit (seconds), capturing stdout+stderr.
CommandResult RunCommand(const std::string& command, int timeout_s = 300);

void WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFile(const std::string& path);

// Quotes `s` for /bin/sh.
std::string ShellQuote(const std::string& s);

// A /bin/sh command line of `args`, each quoted.
std::string ShellCommand(const std::vector<std::string>& args);

// The non-empty lines of `text` (a CLI's output, one batch per line).
std::vector<std::string> SplitLines(const std::string& text);

// The ffmpeg CLI, quiet and non-interactive, overwriting its output: tests make media with it.
inline const std::string kFfmpeg = "ffmpeg -hide_banner -loglevel error -nostdin -y";

// Runs `command`; "" when it exits 0, else the command and its output (for an assertion message).
std::string Sh(const std::string& command);

}  // namespace conveyor::testing

// Asserts that a shell command succeeds, printing it and its output when it does not.
#define ASSERT_SH(command)                                     \
  do {                                                         \
    const std::string err_ = ::conveyor::testing::Sh(command); \
    ASSERT_TRUE(err_.empty()) << err_;                         \
  } while (0)
