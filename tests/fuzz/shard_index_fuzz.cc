// libFuzzer target for the shard index parsers (format/format.h). The first input byte picks
// what the rest is: a whole shard file, an episode index, or a shard directory. Checksums are
// computed here for the latter two so the fuzzer gets past them into the validation logic.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "conveyor/format/v1/shard.pb.h"
#include "format/format.h"

namespace fmt = conveyor::format;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0] % 3;
  std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string_view shard = "fuzz.cvs";
  switch (mode) {
    case 0: {  // a whole shard: header, footer, directory, every episode index
      if (!fmt::CheckShardHeader(bytes.substr(0, fmt::kShardHeaderSize), shard).ok()) return 0;
      if (bytes.size() < fmt::kShardFooterSize) return 0;
      auto footer = fmt::ParseShardFooter(bytes.substr(bytes.size() - fmt::kShardFooterSize),
                                          bytes.size(), shard);
      if (!footer.ok()) return 0;
      auto dir = fmt::ParseShardDirectory(
          bytes.substr(footer->directory_offset, footer->directory_size), *footer, bytes.size(),
          shard);
      if (!dir.ok()) return 0;
      for (const auto& e : dir->episodes()) {
        (void)fmt::ParseEpisodeIndex(bytes.substr(e.index_offset(), e.index_size()),
                                     e.index_offset(), e.index_xxh3(), e.episode_id(),
                                     bytes.size(), shard);
      }
      break;
    }
    case 1: {  // an episode index placed at the end of a file of plausible size
      const uint64_t file_size = bytes.size() + (1u << 20);
      (void)fmt::ParseEpisodeIndex(bytes, file_size - bytes.size() - 40, fmt::Checksum(bytes), 0,
                                   file_size, shard);
      break;
    }
    case 2: {  // a directory with a consistent footer
      fmt::ShardFooter footer;
      footer.directory_offset = 1u << 20;
      footer.directory_size = bytes.size();
      footer.directory_xxh3 = fmt::Checksum(bytes);
      (void)fmt::ParseShardDirectory(bytes, footer, footer.directory_offset + bytes.size() + 40,
                                     shard);
      break;
    }
  }
  return 0;
}
