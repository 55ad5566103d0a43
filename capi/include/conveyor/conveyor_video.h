/* Video decoded on the GPU's NVDEC engines in the trainer's process (pipeline/device_frames.h):
 * libconveyor_video.so.1, a library of its own beside libconveyor_c.so.1, because it carries the
 * data path (the dataset readers, the sample assembler, FFmpeg's demuxer, NVDEC, the CUDA
 * runtime) that a trainer which only receives batches must not need. The Python package loads
 * it only when conveyor.video.DeviceFrames is used (docs/nvdec.md "Into the trainer").
 *
 * The conventions are conveyor_c.h's (status codes, JSON options and results), with this library's
 * own last error and string release: conveyor_video_last_error() and conveyor_video_string_free().
 * A DeviceFrames handle serialises its calls; one serves one trainer process.
 */
#ifndef CONVEYOR_CONVEYOR_VIDEO_H_
#define CONVEYOR_CONVEYOR_VIDEO_H_

#include <stddef.h>
#include <stdint.h>

#include "conveyor/conveyor_c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct conveyor_device_frames conveyor_device_frames;

/* The message of the last failure of this library's calls on the calling thread ("CODE: text"),
 * valid until the thread's next failing call into it. */
CONVEYOR_C_EXPORT const char* conveyor_video_last_error(void);
/* Frees a string this library returned through char**. */
CONVEYOR_C_EXPORT void conveyor_video_string_free(char* s);

/* options_json: {"dataset": location, "config": YAML path, "streams": [names] (default: every
 * video stream of the config), "device": 0, "sessions": 7, "cache_bytes": 1 GiB (device memory
 * keeping decoded frames across batches; 0: none)}. FAILED_PRECONDITION naming why where
 * NVDEC cannot be used (no GPU, no libnvcuvid, built without CUDA). */
CONVEYOR_C_EXPORT int conveyor_device_frames_create(const char* options_json,
                                                    conveyor_device_frames** out);
/* The decoded tensors: [{"name", "dtype" ("uint8" | "float32"), "sample_shape": [T, ...],
 * "sample_bytes", "frames_per_sample"}, ...] in the order conveyor_device_frames_decode indexes. */
CONVEYOR_C_EXPORT int conveyor_device_frames_describe(const conveyor_device_frames* f,
                                                      char** result_json);
/* Decodes tensor `tensor` of n samples, given as a batch's ids (ids[3 * i ...] = index, episode,
 * step, as conveyor_batch_ids writes them; datasets[i] its mixture member, or NULL for all 0),
 * into device memory `dst` (n * sample_bytes), and their padding flags into `pads` (n * T bytes;
 * may be NULL). Writes after the work queued on `cuda_stream` (a cudaStream_t; NULL the legacy
 * default) and returns when every frame is written. */
CONVEYOR_C_EXPORT int conveyor_device_frames_decode(conveyor_device_frames* f, uint32_t tensor,
                                                    const int64_t* ids, const int32_t* datasets,
                                                    uint64_t n, void* dst, uint8_t* pads,
                                                    void* cuda_stream);
/* {"calls", "samples", "frames", "frames_decoded", "seeks", "cache_hits", "frames_cached",
 * "seconds"} since creation. */
CONVEYOR_C_EXPORT int conveyor_device_frames_stats(const conveyor_device_frames* f,
                                                   char** result_json);
CONVEYOR_C_EXPORT void conveyor_device_frames_destroy(conveyor_device_frames* f);

#ifdef __cplusplus
}
#endif

#endif /* CONVEYOR_CONVEYOR_VIDEO_H_ */
