// Forward declarations of the shard index messages (proto/conveyor/format/v1/shard.proto), so that
// public headers can name them without pulling protobuf into whoever includes them. Code that
// builds or reads these messages includes "conveyor/format/v1/shard.pb.h" itself.
#pragma once

namespace conveyor::format::v1 {

// protoc gives every proto3 enum `int` as its underlying type, so this opaque declaration agrees
// with the generated one (a mismatch is a compile error wherever both are seen). A value of it is
// complete here; its enumerators (VIDEO, LOWDIM, ...) need the generated header.
enum StreamKind : int;

class CodecParams;
class PacketTable;
class LowdimBlocks;
class StreamIndex;
class EpisodeIndex;
class DirectoryEntry;
class ShardDirectory;

}  // namespace conveyor::format::v1
