// Which HDF5 datasets make which Conveyor streams (docs/hdf5.md "Layouts"): the ALOHA / ACT
// layout (one episode per file), the robomimic / LIBERO layout (episodes data/demo_N of one or
// more files), or a mapping file the location names (#mapping=map.yaml) for any other layout.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "datasets/hdf5/hdf5_file.h"
#include "format/format_fwd.h"
#include "storage/storage.h"

namespace conveyor::hdf5 {

// One stream: where its data is, relative to the episode's group.
struct StreamSpec {
  std::string name;  // "observation.images.cam_high"
  int kind = 0;      // format::v1::StreamKind: IMAGE, LOWDIM or TEXT
  std::string path;  // IMAGE / LOWDIM: dataset path relative to the episode group
  // IMAGE: rows of encoded files (uint8 [T, maxlen], each row one JPEG or PNG, zero padded),
  // instead of a raw uint8 [T, H, W, 3] array. `codec` "mjpeg" or "png".
  bool encoded = false;
  std::string codec;
  // Encoded rows: each row's byte length, from dataset `lengths_path` ([T], or [N, T] with
  // `lengths_row` the row; ALOHA's compress_len [cameras, T]). Empty: the row with its trailing
  // zero bytes removed.
  std::string lengths_path;
  int lengths_row = -1;
  // TEXT: a fixed `text`, or attribute `attribute` of object `attribute_path` (relative to the
  // episode group, "" the group itself), optionally a key of the JSON the attribute holds.
  std::string text;
  std::string attribute_path, attribute, json_key;
};

struct Layout {
  std::string kind;  // "aloha", "robomimic", "mapped"
  double rate = 0;   // steps/s (0: not given)
  // "" : each file is one episode (its root group). Otherwise each child group of this group
  // whose name starts with `group_prefix` is an episode (robomimic: "/data", "demo_"), in
  // natural order of their names.
  std::string episode_group;
  std::string group_prefix;
  std::vector<std::string> files;  // mapping: the files to read (empty: the location's)
  std::vector<StreamSpec> streams;
};

// ALOHA: /observations/images/<cam> (raw or, with /compress_len, JPEG rows), /observations/qpos
// -> observation.state, qvel -> observation.velocity, effort -> observation.effort, other
// /observations/<x> -> observation.<x>, /action -> action, other numeric root datasets by name.
absl::StatusOr<Layout> AlohaLayout(const File& file);
// robomimic: data/<demo>/obs/<key> (images -> observation.images.<key>, else observation.<key>),
// actions -> action, rewards -> reward, dones -> done, states -> observation.sim_state; the
// language instruction of LIBERO's problem_info as the `instruction` TEXT stream.
absl::StatusOr<Layout> RobomimicLayout(const File& file);
// The layout a file has ("aloha" or "robomimic"), NOT_FOUND when neither.
absl::StatusOr<Layout> DetectLayout(const File& file);
// `rel` (a path relative to an episode's group, ".." its parent) as an absolute HDF5 path.
std::string PathIn(const std::string& group, const std::string& rel);

// The byte size of each frame of an encoded IMAGE stream's rows `a` (uint8 [T, maxlen]) of the
// episode at `group`: its lengths dataset (an ALOHA compress_len row matched to the camera by
// frame 0's JPEG end), or each row without its trailing zeros. A length past the row is a
// DATA_LOSS naming the file, the lengths dataset, the stream and the frame.
absl::StatusOr<std::vector<uint32_t>> EncodedSizes(const File& f, const RandomAccessFile& raf,
                                                   const std::string& group, const StreamSpec& s,
                                                   const Array& a);

// A mapping file (YAML or JSON). `name` names it in errors.
absl::StatusOr<Layout> ParseMapping(const std::string& text, const std::string& name);

}  // namespace conveyor::hdf5
