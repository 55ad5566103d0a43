// Internal to the server: one admitted StreamBatches call, from its request to its last batch.
// It resolves the request's config, applies the server's ceilings, reserves the stream's memory,
// builds its pipeline, grants its carrier (server/internal/carrier.h), sends the stream start and
// then one batch at a time through the carrier's sink. Used by the call's handler thread only;
// the server's shared state is reached under its locks (server/internal/server_impl.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "server/internal/server_impl.h"

namespace conveyor {

class ServedStream {
 public:
  // `entry` is admitted (DataServer::Impl::Admit) and outlives this stream; `job` is the request's
  // job name, validated.
  ServedStream(DataServer::Impl& server, grpc::ServerContext* ctx, const v1::StreamBatchesRequest& req,
               DataServer::Impl::Writer* writer, ActiveStream* entry, std::string job);
  ~ServedStream();  // the reaper no longer sees the pipeline; the carrier's reservations end
  ServedStream(const ServedStream&) = delete;
  ServedStream& operator=(const ServedStream&) = delete;

  // Serves the stream to its end. *outcome: the metrics' label of how it ended (ok, rejected,
  // cancelled, shutdown, stalled, error).
  grpc::Status Serve(std::string* outcome);

 private:
  // The request's dataset, consumer, config and schedule version, or why not.
  grpc::Status ResolveRequest();
  grpc::Status PickConfig();
  // The job's pin (its checkpoint, or its launcher's), refused before any work.
  grpc::Status CheckPin();
  // The ceilings of ServerLimits, applied to the resolved config and this request's options:
  // lowers the config's decode limits to the server's; refuses what cannot fit; sets
  // stream_bytes_ and batch_bytes_ from the stream's memory estimate.
  grpc::Status CheckCeilings();
  // The pipeline, the carrier and the stream start, sent; *sink is where batches go.
  grpc::Status Open(std::unique_ptr<PayloadSink>* sink);
  void FillStart(v1::StreamStart* st) const;
  grpc::Status SendAll(PayloadSink& sink);
  grpc::Status Finish(grpc::Status status, const char* outcome);
  // One write outstanding: the carrier's Send returns when gRPC took the messages (flow control).
  absl::Status SendBatch(const Batch& b, PayloadSink& sink);
  void Account(const PipelineStats& a, const PipelineStats& b);
  void RecordCoverage(const Batch& batch);
  // Where each tensor's bytes are counted in metrics: masks by role, a stream's samples by its
  // kind, the rest as the mixture's tag or packing bookkeeping.
  std::string Modality(const TensorView& tensor) const;

  DataServer::Impl& server_;
  grpc::ServerContext* const ctx_;
  const v1::StreamBatchesRequest& req_;
  DataServer::Impl::Writer* const writer_;
  ActiveStream* const entry_;
  const std::string job_;
  std::string* outcome_ = nullptr;

  std::shared_ptr<Config> config_;
  SampleSpec spec_;  // the config's, with the server's ceilings applied
  PipelineOptions po_;
  uint64_t max_message_ = 0;
  uint64_t stream_bytes_ = 0, batch_bytes_ = 0;  // the memory estimate
  std::optional<DataServer::Impl::MemoryReservation> reservation_;  // held until the stream ends
  std::unique_ptr<Pipeline> pipeline_;
  // Declared after the pipeline: released before it, after the sink made from it.
  std::unique_ptr<CarrierGrant> carrier_;
  PipelineStats last_{};  // the pipeline's figures at the last batch
};

}  // namespace conveyor
