#include "tests/support/media_checks.h"

extern "C" {
#include <libavutil/md5.h>
}

#include <gtest/gtest.h>

#include <sstream>

#include "tests/support/test_env.h"

namespace conveyor::testing {

std::vector<std::string> FrameMd5s(const std::string& file, const std::string& type,
                                   const std::string& output_args) {
  CommandResult r = RunCommand("ffmpeg -v error -nostdin -i " + ShellQuote(file) + " -map 0:" +
                                   type + ":0 -fps_mode passthrough " + output_args + " -f framemd5 -",
                               120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> md5s;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t start = line.find_first_not_of(' ', line.rfind(',') + 1);
    md5s.push_back(line.substr(start));
  }
  return md5s;
}

std::string Md5Hex(const void* data, size_t size) {
  uint8_t digest[16];
  av_md5_sum(digest, static_cast<const uint8_t*>(data), size);
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : digest) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

}  // namespace conveyor::testing
