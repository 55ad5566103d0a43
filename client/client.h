// The Conveyor client: what a training worker links to receive its batches from one or more data
// servers. It depends on the wire protocol only (proto/conveyor/v1/service.proto, gRPC, absl): no
// FFmpeg, no server code.
//
// Contract:
//  - Next() returns the batches of (job, consumer, consumers) in order, starting at
//    options.start. A background thread keeps up to `prefetch_batches` (and `prefetch_bytes`)
//    received batches ready; when the queue is full it stops reading, and gRPC flow control
//    stops the server.
//  - A batch's payload is parsed straight from gRPC's receive buffers into one 64-byte aligned
//    block (one copy, no join however the server split it into messages); its tensors are views
//    into that block, valid while the Batch lives. Blocks are reused once batches are released.
//  - cursor() is the cursor right after the last batch Next() returned: save it with the model
//    checkpoint and pass it as options.start to resume with exactly the next batch. It names a
//    sample position (EPOCH@POSITION), so the job may resume at another global batch size and
//    world size (docs/pipeline.md "Resuming at another batch size").
//  - Which server first: the first address when it is a loopback one (a server on this node),
//    else servers[consumer % n], so ranks given the same list spread over it.
//  - Failover: when the server fails or becomes unreachable, the client reconnects to the next
//    address in `servers` and asks for the cursor after the last batch it *received*; batches
//    already queued are kept. The trainer sees no lost and no repeated batch. Every server must
//    serve the same dataset and config: the client checks the dataset fingerprint and the config
//    digest on each (re)connection and fails with FAILED_PRECONDITION otherwise.
//  - Errors the next server would repeat (bad request, bad data, authentication) are returned by
//    Next() as they are; transport errors are retried until `reconnect_timeout_s` passes without
//    a batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/coverage.h"
#include "base/tensor_desc.h"
#include "base/types.h"

namespace conveyor::v1 {
class InfoResponse;
class StreamStart;
}  // namespace conveyor::v1

namespace conveyor::client {

// The shared vocabulary (base/types.h): one Cursor parser, one DType, one SampleId everywhere.
using ::conveyor::CoverageSlice;
using ::conveyor::Cursor;
using ::conveyor::DType;
using ::conveyor::DTypeName;
using ::conveyor::DTypeSize;
using ::conveyor::SampleId;

using ::conveyor::TensorDesc;
using ::conveyor::TensorRole;

// A received tensor: its description (name, dtype, shape, role; base/tensor_desc.h) and a view of
// `bytes` bytes of the Batch's memory, valid while the Batch lives.
struct TensorView : TensorDesc {
  const uint8_t* data = nullptr;  // host memory owned by the Batch
  size_t bytes = 0;
  // Device memory (of Batch::device) when ClientOptions::device: valid once the copy has finished
  // (Batch::WaitOnStream or WaitDevice), while the Batch lives. Null otherwise.
  void* device_data = nullptr;
};

struct Batch {
  Cursor cursor;
  Cursor next;  // resumes right after this batch
  uint32_t consumer = 0;
  uint32_t consumers = 1;
  std::vector<SampleId> ids;
  std::vector<TensorView> tensors;
  uint32_t packed_sequences = 0;  // packed batches only
  double fill_ratio = 0;
  std::string server;             // the address that sent it
  // Device delivery (ClientOptions::device): the CUDA device of the tensors' device_data, and the
  // CUDA event (cudaEvent_t) recorded on the uploader's stream after the batch's one copy. -1 and
  // null otherwise.
  int device = -1;
  void* ready_event = nullptr;

  const TensorView* Find(std::string_view name) const;
  size_t bytes() const;

  // Device delivery, without CUDA types (streams are cudaStream_t as void*; nullptr is the legacy
  // default stream). OK and nothing done when the batch has no device copy. Like the batch
  // itself, one thread at a time.
  //  - WaitOnStream: work enqueued on `cuda_stream` from now on waits, on the GPU, for the copy
  //    (cudaStreamWaitEvent); the host does not block. The way to consume a batch.
  //  - RecordUse: the work enqueued on `cuda_stream` so far reads the tensors; the batch's device
  //    buffer is not overwritten by a later batch before that work is done, so the Batch may be
  //    dropped without synchronizing. REQUIRES before dropping a batch whose device_data kernels
  //    may still read (as PyTorch's record_stream).
  //  - WaitDevice: blocks the calling thread until the copy is done.
  absl::Status WaitOnStream(void* cuda_stream) const;
  absl::Status RecordUse(void* cuda_stream) const;
  absl::Status WaitDevice() const;

  std::shared_ptr<void> storage;  // keeps the received messages (and device memory) alive
};

struct ClientOptions {
  std::vector<std::string> servers;  // host:port, or any gRPC target such as dns:///name:port
  std::string job = "default";
  std::string dataset;               // empty: whatever the server serves
  uint32_t consumer = 0;
  uint32_t consumers = 1;
  // Where to start. A cursor with a position (EPOCH@POSITION, what cursor() returns from current
  // servers) resumes at any global batch size and world size and continues the same global
  // sample sequence; an EPOCH:STEP cursor means step x the config's global_batch_size. To resume
  // an EPOCH:STEP cursor recorded at another batch size B0, pass Cursor::PositionAt(B0)'s
  // position. A server that predates positions refuses a position cursor (FAILED_PRECONDITION).
  Cursor start;
  std::string config_yaml;           // inline config; or
  std::string config_name;           // a config the server was started with (empty: its default)
  uint64_t max_batches = 0;          // 0: until the server's max_epochs, or forever
  size_t prefetch_batches = 4;
  uint64_t prefetch_bytes = 1ull << 30;
  uint64_t max_message_bytes = 0;    // 0: the server's default
  // The GOP schedule's version (docs/pipeline.md "Schedule versions"): 0 = the config's. A job
  // resuming from a checkpoint passes the schedule_version() it saved beside the cursor, so it
  // continues the order it started even after the default changes.
  uint32_t schedule_version = 0;
  // What the job trained on, saved with its checkpoint (ClientStats::dataset_fingerprint and
  // order_digest; the Loader's state_dict): a server that serves another dataset, or a config
  // whose samples differ (anything but the batch size, threads, queue and max_epochs), is
  // refused with FAILED_PRECONDITION naming both, because the saved cursor names other samples
  // there (a re-imported or grown dataset, another path, a changed augmentation). Empty: not
  // checked, which is how a job continues on purpose after its data changed (docs/python.md
  // "What a job pins").
  std::string expect_dataset_fingerprint;
  std::string expect_order_digest;
  // Take expect_* from $CONVEYOR_DATASET_FINGERPRINT / $CONVEYOR_ORDER_DIGEST where they are
  // empty: the launcher's pin, so a rank pointed at a stray server is refused on a fresh start
  // too (docs/launch.md "Pinning the data"). False for a resume that changes data on purpose.
  bool pin_from_environment = true;
  // The largest batch this client accepts (its payload is allocated once the header arrives); a
  // larger one ends the stream with RESOURCE_EXHAUSTED instead of exhausting memory.
  uint64_t max_batch_bytes = 8ull << 30;
  std::string auth_token;            // sent as "authorization: Bearer TOKEN"
  // The job's secret, shared by all its ranks (docs/serving.md "Job identity"): the first stream
  // or report of a job name on a server sets the job's secret there, and a call that presents
  // another is refused with PERMISSION_DENIED, so another client cannot stream under the job's
  // name into its coverage ledger, metrics or reports. Empty: $CONVEYOR_JOB_SECRET, which a
  // launcher exports per job (docs/launch.md); none when that is unset. 1 to 256 printable ASCII
  // characters (openssl rand -hex 16).
  std::string job_secret;
  // TLS: any of these set switches the channel to TLS.
  bool tls = false;
  std::string tls_ca_pem;            // roots to verify the server (empty: system roots)
  std::string tls_cert_pem, tls_key_pem;  // client certificate, when the server asks for one
  std::string tls_server_name;       // override the name checked in the server's certificate
  double reconnect_timeout_s = 60;   // give up after this long without a batch
  // Device delivery (device/upload.h, docs/serving.md "Device delivery"): each batch is also copied
  // to CUDA device `device_index`, as it arrives, with one asynchronous copy on the client's own
  // stream from a pinned block into one of `device_buffers` device buffers (grown to the largest
  // batch and reused), so the copy of the next batch overlaps the trainer's work on this one.
  // Create fails with FAILED_PRECONDITION, saying why, when there is no usable GPU (a build
  // without CUDA, no driver, no device), and INVALID_ARGUMENT when device_index does not exist.
  // A trainer that holds all device_buffers batches and asks for another gets
  // RESOURCE_EXHAUSTED from Next() instead of waiting forever.
  bool device = false;
  int device_index = 0;
  // 0: prefetch_batches + 2 (the queue, the trainer's batch and the one being copied). Device
  // memory is about device_buffers x the largest batch.
  size_t device_buffers = 0;
  // Every this many seconds, the client reports the steps since its last report (how many, their
  // wall time from one Next() to the next, each one's wait inside Next()) to the server of its
  // stream, which exports them per job (docs/serving.md "Metrics"). One small unary call on its
  // own thread, never in Next()'s way; a server that does not know the call ends the reports.
  // 0: never report.
  double report_interval_s = 1;
  // The same-host transport (docs/serving.md "Same-host transport"): each stream offers to take
  // a region of at most this many bytes from a server on this host, which builds batches there;
  // Batch tensors view them in place (no gRPC payload, no copy here). A server elsewhere refuses
  // and payloads travel in gRPC messages. Size it for prefetch_batches + 2 batches; a batch
  // larger than the server's ring travels in messages.
  bool shared_memory = true;
  uint64_t shared_memory_bytes = 256ull << 20;
  // Striped payloads (docs/serving.md "Striped payloads"): above 1, each stream's payload
  // messages come over this many more streams (at most 8), each on a connection of its own, so
  // that one client is not bound by one TCP connection. Only where payloads travel in messages
  // (not through shared memory).
  uint32_t payload_streams = 1;
};

struct ClientStats {
  uint64_t batches = 0;
  uint64_t bytes = 0;            // tensor bytes received
  uint64_t messages = 0;
  uint64_t reconnects = 0;       // streams opened after the first
  double wait_seconds = 0;       // Next() waiting for a batch
  uint64_t reports = 0;          // data-wait reports the servers accepted
  std::string server;            // the server of the current stream
  std::string transport;         // of the current stream: "shared_memory" or "grpc"
  std::string shared_memory_refused;  // why the server did not use the offered region
  uint64_t shared_memory_batches = 0;  // batches whose payload came through shared memory
  // What the stream serves (empty before the first stream start): save the fingerprint and
  // digest with the cursor, and pass them back as ClientOptions::expect_* when resuming.
  std::string dataset_name;
  std::string dataset_fingerprint;
  std::string config_digest;
  std::string order_digest;
};

class Client {
 public:
  // Validates the options and starts streaming in the background. Connection errors surface
  // from Next().
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);
  ~Client();  // cancels the stream and joins the background thread
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The next batch; std::nullopt at the end of the stream (max_batches, or the server's
  // max_epochs), which is not an error. CANCELLED after Cancel(); any error is final for this
  // client, OUT_OF_RANGE included (a start cursor past the end of the data).
  absl::StatusOr<std::optional<Batch>> Next();
  // As Next(), but DEADLINE_EXCEEDED (not final: call again) when no batch came within
  // `timeout_s`, so a caller can check for interrupts (Python's Ctrl-C) while it waits.
  absl::StatusOr<std::optional<Batch>> Next(double timeout_s);
  // Thread-safe: ends the stream; a Next() waiting in another thread returns CANCELLED at once.
  void Cancel();

  Cursor cursor() const;
  // The order's schedule version, from the server's stream start (0 before the first batch):
  // save it with cursor() in a checkpoint.
  uint32_t schedule_version() const;
  // The job's global batch size, from the server's stream start (0 before the first batch). A
  // checkpoint saves it beside cursor() so that an EPOCH:STEP cursor (from a server that predates
  // positions) keeps its meaning when the job resumes at another batch size.
  uint64_t global_batch_size() const;
  // The coverage ledger of what Next() returned (base/coverage.h): per epoch (the latest 16) and
  // consumer slice, the samples and their order-independent digest. A trainer writes it with its
  // results, and `conveyor audit` checks it against the order (docs/pipeline.md "Coverage ledger").
  std::vector<CoverageSlice> coverage() const;
  ClientStats stats() const;
  // Whether device delivery can work here: built with CUDA and a usable GPU.
  static bool device_supported();
  // OK when ClientOptions::device with this device_index would work here; else why not:
  // FAILED_PRECONDITION naming the device and the reason (built without CUDA, the CUDA runtime's
  // error), INVALID_ARGUMENT for an ordinal that does not exist.
  static absl::Status CheckDevice(int device_index);

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // released, not destroyed, in a forked child (see ~Client)
};

// A comma-separated list of server addresses; an empty `list` means $CONVEYOR_SERVERS.
std::vector<std::string> ParseServers(std::string_view list);

// Info from the first server that answers.
absl::StatusOr<conveyor::v1::InfoResponse> GetInfo(const ClientOptions& options);

// The protocol version this client speaks.
uint32_t ProtocolVersion();

}  // namespace conveyor::client
