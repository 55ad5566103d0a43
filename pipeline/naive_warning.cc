#include "pipeline/naive_warning.h"

#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"

namespace conveyor {

std::string NaiveOrderWarning(const Source& source, const SampleSpec& spec, const PipelineOptions& options) {
  // Clips per video have no decode-once order: the naive one is theirs (shuffle/schedule.h).
  if (options.schedule_given || !options.order.naive() || spec.clips.enabled()) return "";
  bool video = false;
  for (const StreamSpec& s : spec.streams) video = video || s.kind == format::v1::VIDEO;
  bool whole = false;
  for (size_t k = 0; k < source.size(); ++k) whole = whole || source.dataset(k).reads_whole_episodes();
  if (!video && !whole) return "";
  return StrCat(
      "the config names no pipeline.schedule, so it gets the naive order: ",
      video ? "every sample decodes its video from a keyframe (measured on a synthetic H.264 dataset: "
              "9.7 frames decoded per frame delivered against 0.37 with the decode-once order, about 3x "
              "slower)"
            : "",
      video && whole ? "; " : "",
      whole ? "an episode read whole (RLDS) is read again for most samples once the dataset outgrows "
              "its episode cache (measured: 144x the bytes, 4x slower; bench/RESULTS.md \"RLDS in place\")"
            : "",
      ". Add `pipeline: {schedule: {mode: gop}}` for the decode-once order (docs/pipeline.md "
      "\"Decode-once GOP scheduling\"); the same samples are served, in another order");
}

}  // namespace conveyor
