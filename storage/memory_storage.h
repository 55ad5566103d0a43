// An in-memory Storage (leveldb's memenv): files held as strings, for tests and fuzzers that need a
// dataset without a disk or a server, and for failing a read at a chosen offset.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "storage/storage.h"

namespace conveyor {

struct MemoryStorageOptions {
  // Served for any path not in `files` (a fuzzer's one shard under whatever name the manifest
  // gives it); nullopt: NOT_FOUND.
  std::optional<std::string> any_other_file;
  // A read that touches this byte offset of any file fails with UNAVAILABLE (fault injection).
  std::optional<uint64_t> fail_at_offset;
};

// Thread-safe: the files are immutable after construction.
std::unique_ptr<Storage> NewMemoryStorage(std::map<std::string, std::string> files,
                                          MemoryStorageOptions options = {});

}  // namespace conveyor
