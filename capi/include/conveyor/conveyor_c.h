/* Conveyor's C ABI: the client (client/client.h) for any language that can call C.
 *
 * The Python package `conveyor` loads this library (libconveyor_c.so.1) with ctypes, so it works
 * in any CPython 3.9+ with nothing compiled against the interpreter (as XGBoost and LightGBM do);
 * Julia, Rust or Go can bind it the same way. docs/python.md and docs/c_api.md describe it.
 *
 * It links the client only (base/, the wire protocol, device/): no FFmpeg, libjpeg-turbo, curl,
 * yaml-cpp or CUDA runtime among its needed libraries (tests/capi_needed_test.sh); the CUDA
 * runtime is loaded where a GPU is asked for. Decoding in the trainer's process (DeviceFrames,
 * which needs the data path) is libconveyor_video.so.1, conveyor/conveyor_video.h.
 *
 * Conventions:
 *  - Every function that can fail returns an int status code: 0 (CONVEYOR_OK) or one of gRPC's /
 *    absl's status codes (3 INVALID_ARGUMENT, 9 FAILED_PRECONDITION, 14 UNAVAILABLE, ...). The
 *    message of the last failure on the calling thread is conveyor_last_error() ("CODE: text"),
 *    valid until the thread's next failing call.
 *  - Options and structured results travel as JSON text (UTF-8): new options never change the
 *    ABI, and an unknown option is INVALID_ARGUMENT naming it. Strings this library returns
 *    through char** are freed with conveyor_string_free().
 *  - Structs passed out begin with `size`: set it to sizeof(the struct) before the call; fields
 *    past it are not written (a caller built against an older header keeps working).
 *  - Handles are not thread-safe unless said otherwise: one thread at a time per client and per
 *    batch. conveyor_client_cancel() may be called from any thread.
 *  - Host tensor memory lives as long as its batch handle or any DLPack export of it.
 */
#ifndef CONVEYOR_CONVEYOR_C_H_
#define CONVEYOR_CONVEYOR_C_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define CONVEYOR_C_EXPORT __attribute__((visibility("default")))
#else
#define CONVEYOR_C_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a function's signature or a struct's existing fields change. */
#define CONVEYOR_C_ABI_VERSION 1

enum {
  CONVEYOR_OK = 0,
  CONVEYOR_CANCELLED = 1,
  CONVEYOR_INVALID_ARGUMENT = 3,
  CONVEYOR_DEADLINE_EXCEEDED = 4,
  CONVEYOR_RESOURCE_EXHAUSTED = 8,
  CONVEYOR_FAILED_PRECONDITION = 9,
  CONVEYOR_OUT_OF_RANGE = 11,
  CONVEYOR_INTERNAL = 13,
  CONVEYOR_UNAVAILABLE = 14
};

/* Element types of tensors (base/types.h's DType); codes are only ever appended. FLOAT16 is IEEE
 * binary16, BFLOAT16 a float32's upper 16 bits (rounded), 2 bytes each, as a stream's `dtype:`
 * asks (docs/sampling.md "Tensor dtypes"). */
enum {
  CONVEYOR_UINT8 = 0,
  CONVEYOR_BOOL = 1,
  CONVEYOR_FLOAT32 = 2,
  CONVEYOR_INT32 = 3,
  CONVEYOR_FLOAT16 = 4,
  CONVEYOR_BFLOAT16 = 5
};

/* What a tensor is for (client/client.h's TensorRole). */
enum {
  CONVEYOR_ROLE_DATA = 0,
  CONVEYOR_ROLE_PADDING_MASK = 1,
  CONVEYOR_ROLE_SEGMENT_IDS = 2,
  CONVEYOR_ROLE_POSITIONS = 3,
  CONVEYOR_ROLE_SAMPLE_INFO = 4
};

typedef struct conveyor_client conveyor_client;
typedef struct conveyor_batch conveyor_batch;

/* DLPack's DLManagedTensor (dlpack.h v0.8, a stable C layout), spelled out because Debian
 * packages no dlpack.h. */
typedef struct {
  int32_t device_type; /* 1 kDLCPU, 2 kDLCUDA */
  int32_t device_id;
} conveyor_dl_device;
typedef struct {
  uint8_t code; /* 0 int, 1 uint, 2 float, 4 bfloat, 6 bool */
  uint8_t bits;
  uint16_t lanes;
} conveyor_dl_dtype;
typedef struct {
  void* data;
  conveyor_dl_device device;
  int32_t ndim;
  conveyor_dl_dtype dtype;
  int64_t* shape;
  int64_t* strides; /* NULL: C-contiguous */
  uint64_t byte_offset;
} conveyor_dl_tensor;
typedef struct conveyor_dl_managed_tensor {
  conveyor_dl_tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct conveyor_dl_managed_tensor* self);
} conveyor_dl_managed_tensor;

typedef struct {
  uint32_t size;           /* sizeof(conveyor_tensor) */
  const char* name;        /* NUL-terminated, valid while the batch handle lives */
  int32_t dtype;           /* CONVEYOR_UINT8, ... */
  int32_t role;            /* CONVEYOR_ROLE_DATA, ... */
  int32_t ndim;
  const int64_t* shape;    /* ndim entries, valid while the batch handle lives */
  const void* data;        /* host bytes, C-contiguous, 64-byte aligned; NULL when empty */
  uint64_t bytes;
  void* device_data;       /* the device copy (device delivery), else NULL */
} conveyor_tensor;

typedef struct {
  uint32_t size;           /* sizeof(conveyor_batch_info) */
  uint64_t epoch, step;           /* this batch's cursor */
  uint64_t next_epoch, next_step; /* the cursor right after it */
  uint32_t consumer, consumers;
  uint64_t samples;               /* rows of conveyor_batch_ids() */
  uint32_t tensors;               /* conveyor_batch_tensor() indexes 0..tensors-1 */
  uint32_t packed_sequences;
  double fill_ratio;
  const char* server;             /* the address that sent it */
  int32_t device;                 /* CUDA ordinal of device_data, -1 without device delivery */
  const void* payload;            /* the host block holding every tensor's bytes */
  uint64_t payload_bytes;
  /* Sample positions in their epochs of this batch's cursor and of the one right after it
   * (EPOCH@POSITION: resumes at any global batch size); CONVEYOR_NO_POSITION from a server that
   * predates positions. */
  uint64_t position, next_position;
} conveyor_batch_info;

#define CONVEYOR_NO_POSITION UINT64_MAX

/* --- the library -------------------------------------------------------------------------- */
CONVEYOR_C_EXPORT uint32_t conveyor_abi_version(void);
CONVEYOR_C_EXPORT const char* conveyor_version(void);          /* "0.1.0" */
CONVEYOR_C_EXPORT uint32_t conveyor_protocol_version(void);    /* the conveyor.v1 wire protocol */
/* The message of the calling thread's last failure; "" when none. */
CONVEYOR_C_EXPORT const char* conveyor_last_error(void);
CONVEYOR_C_EXPORT void conveyor_string_free(char* s);
/* 1 when device delivery can work here (a CUDA build and a usable GPU), else 0. */
CONVEYOR_C_EXPORT int conveyor_device_supported(void);
/* OK when device delivery to CUDA device `index` can work; else FAILED_PRECONDITION (no usable
 * GPU, and why) or INVALID_ARGUMENT (no such device). */
CONVEYOR_C_EXPORT int conveyor_check_device(int index);

/* Rank, world size, local rank and servers as the launcher set them (client/launch_env.h).
 * request: {"rank": int|null, "world_size": int|null, "servers": "a,b", "servers_required":
 * bool, "from_jax": bool}; *result: {"rank", "world_size", "local_rank", "local_world_size",
 * "source", "servers": [...], "servers_source"}. */
CONVEYOR_C_EXPORT int conveyor_resolve_launch(const char* request_json, char** result_json);
/* conveyor.v1.InfoResponse of the first server that answers, as JSON (proto field names, every
 * field present; 64-bit integers as JSON numbers, not the proto3 mapping's strings).
 * options: {"servers": [...], "auth_token": "..."}. */
CONVEYOR_C_EXPORT int conveyor_get_info(const char* options_json, char** result_json);

/* --- clients ------------------------------------------------------------------------------ */
/* Starts streaming in the background (client/client.h's ClientOptions as JSON, same names:
 * {"servers": [...], "job", "consumer", "consumers", "start": [epoch, step] or the cursor's text
 * "EPOCH:STEP" or "EPOCH@POSITION" (a sample position: any global batch size), "config_yaml",
 * "config_name", "max_batches", "prefetch_batches", "prefetch_bytes", "max_message_bytes",
 * "schedule_version", "max_batch_bytes", "auth_token", "tls", "tls_ca_pem", "tls_cert_pem",
 * "tls_key_pem", "tls_server_name", "reconnect_timeout_s", "device": -1|N, "device_buffers",
 * "report_interval_s", "shared_memory", "shared_memory_bytes", "payload_streams", "dataset",
 * "expect_dataset_fingerprint", "expect_order_digest", "pin_from_environment"}: the last two, saved from a checkpoint,
 * make a server of other data fail the stream with FAILED_PRECONDITION). */
CONVEYOR_C_EXPORT int conveyor_client_create(const char* options_json, conveyor_client** out);
/* The next batch into *out. OK with *out == NULL: the end of the stream (not an error).
 * timeout_s < 0 waits as long as it takes; otherwise DEADLINE_EXCEEDED (not final: call again)
 * when none came in time. Any other error is final for this client. */
CONVEYOR_C_EXPORT int conveyor_client_next(conveyor_client* c, double timeout_s,
                                           conveyor_batch** out);
/* Thread-safe: ends the stream; a conveyor_client_next() waiting in another thread returns
 * CANCELLED at once. */
CONVEYOR_C_EXPORT void conveyor_client_cancel(conveyor_client* c);
/* The cursor right after the last batch returned, and the order's schedule version. */
CONVEYOR_C_EXPORT void conveyor_client_cursor(const conveyor_client* c, uint64_t* epoch,
                                              uint64_t* step);
CONVEYOR_C_EXPORT uint32_t conveyor_client_schedule_version(const conveyor_client* c);
/* The job's global batch size from the server (0 before the first batch): save it with an
 * EPOCH:STEP cursor, which means step x this batch size. */
CONVEYOR_C_EXPORT uint64_t conveyor_client_global_batch_size(const conveyor_client* c);
/* The coverage ledger of what the client returned (client/client.h Client::coverage):
 * {"coverage": [{"epoch", "consumer", "consumers", "global_batch_size", "samples", "digest" (16
 * hex digits), "first_position", "end_position", "batches"}, ...]}, what `conveyor audit
 * --trainer-json` reads. */
CONVEYOR_C_EXPORT int conveyor_client_coverage(const conveyor_client* c, char** result_json);
/* {"batches", "bytes", "messages", "reconnects", "wait_seconds", "reports", "server",
 * "transport", "shared_memory_refused", "shared_memory_batches", "dataset_name",
 * "dataset_fingerprint", "config_digest", "order_digest"} (the last four empty before the first
 * batch). */
CONVEYOR_C_EXPORT int conveyor_client_stats(const conveyor_client* c, char** result_json);
/* Cancels the stream, joins the client's threads and frees it. Batches stay valid. */
CONVEYOR_C_EXPORT void conveyor_client_destroy(conveyor_client* c);
/* For a forked child holding a copy of its parent's client: frees nothing and joins nothing (the
 * threads live in the parent only), so the child does not abort. */
CONVEYOR_C_EXPORT void conveyor_client_abandon(conveyor_client* c);

/* --- batches ------------------------------------------------------------------------------ */
CONVEYOR_C_EXPORT int conveyor_batch_info_get(const conveyor_batch* b, conveyor_batch_info* out);
CONVEYOR_C_EXPORT int conveyor_batch_tensor(const conveyor_batch* b, uint32_t index,
                                            conveyor_tensor* out);
/* A 64-bit key of the batch's layout: its tensors' names, types, roles, shapes and offsets in the
 * payload. Batches of one stream almost always share it, so a binding can describe the tensors
 * once per key (conveyor_batch_tensor) and only place views at the payload of later batches. */
CONVEYOR_C_EXPORT uint64_t conveyor_batch_layout(const conveyor_batch* b);
/* Per sample (index, episode, step) into ids[3 * i ...] and its dataset (in a mixture) into
 * datasets[i]; either may be NULL. Both hold info.samples entries. */
CONVEYOR_C_EXPORT int conveyor_batch_ids(const conveyor_batch* b, int64_t* ids, int32_t* datasets);
/* Device delivery: work enqueued on `cuda_stream` (a cudaStream_t; NULL the legacy default)
 * from now on waits, on the GPU, for the batch's copy; the host does not block. The stream is
 * remembered: when the batch and all its exports are gone, its device buffer is not reused
 * before the work enqueued there so far is done (as torch's record_stream). OK and nothing done
 * without a device copy. */
CONVEYOR_C_EXPORT int conveyor_batch_wait_on_stream(conveyor_batch* b, void* cuda_stream);
/* Blocks until the batch's device copy is done. */
CONVEYOR_C_EXPORT int conveyor_batch_wait_device(conveyor_batch* b);
/* A DLPack export of tensor `index` (host bytes, or the device copy when on_device), holding
 * the batch until its deleter runs. as_uint8 exports the bytes as uint8 (for consumers without
 * DLPack's bool). */
CONVEYOR_C_EXPORT int conveyor_batch_dlpack(conveyor_batch* b, uint32_t index, int on_device,
                                            int as_uint8, conveyor_dl_managed_tensor** out);
/* Releases the handle; the batch's memory goes back to its client once no export holds it. */
CONVEYOR_C_EXPORT void conveyor_batch_free(conveyor_batch* b);

/* --- for bindings: one definition of what the client parses and defaults to -------------- */
/* A cursor's text, "EPOCH:STEP" or "EPOCH@POSITION", read by the client's own parser
 * (base/types.h Cursor::Parse), so a binding accepts exactly what conveyor_client_create's
 * "start" does. *position is CONVEYOR_NO_POSITION for EPOCH:STEP and *step 0 for
 * EPOCH@POSITION. INVALID_ARGUMENT naming the text otherwise; nothing is written then. */
CONVEYOR_C_EXPORT int conveyor_parse_cursor(const char* text, uint64_t* epoch, uint64_t* step,
                                            uint64_t* position);
/* Every option conveyor_client_create takes, at the value it has when left out (client/client.h
 * ClientOptions), as a JSON object with the same names: {"job": "default", "prefetch_batches": 4,
 * "start": "0:0", "device": -1, ...}, so a binding restates none of them. */
CONVEYOR_C_EXPORT int conveyor_client_defaults(char** result_json);

#ifdef __cplusplus
}
#endif

#endif /* CONVEYOR_CONVEYOR_C_H_ */
