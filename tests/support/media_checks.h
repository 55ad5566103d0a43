// Checks of media files through the ffmpeg command line: the independent tool our golden values
// come from.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace conveyor::testing {

// The md5 column of `ffmpeg -f framemd5` for the first stream of `type` ("v" or "a") of `file`,
// one entry per decoded frame, with no frame dropped or duplicated to fit a frame rate.
// `output_args` go before the muxer (e.g. "-pix_fmt rgb24" for the md5 of RGB frames).
std::vector<std::string> FrameMd5s(const std::string& file, const std::string& type = "v",
                                   const std::string& output_args = "");

// The md5 of `size` bytes as 32 hex digits, as `ffmpeg -f framemd5` prints it (libavutil's md5).
std::string Md5Hex(const void* data, size_t size);

}  // namespace conveyor::testing
