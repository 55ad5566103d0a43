#include "client/internal/raw_stream.h"

namespace conveyor::client {

RawStream::RawStream(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* ctx,
                     const std::string& request)
    : stub_(channel) {
  call_ = stub_.PrepareCall(ctx, "/conveyor.v1.Conveyor/StreamBatches", &cq_);
  call_->StartCall(nullptr);
  open_ = Wait();
  if (open_) {
    grpc::Slice slice(request);
    grpc::ByteBuffer bb(&slice, 1);
    call_->Write(bb, nullptr);
    open_ = Wait();
  }
  if (open_) {
    call_->WritesDone(nullptr);
    open_ = Wait();
  }
}

RawStream::~RawStream() {
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
}

bool RawStream::Wait() {
  void* tag = nullptr;
  bool ok = false;
  return cq_.Next(&tag, &ok) && ok;
}

bool RawStream::Read(grpc::ByteBuffer* m) {
  if (!open_) return false;
  call_->Read(m, nullptr);
  open_ = Wait();
  return open_;
}

grpc::Status RawStream::Finish() {
  grpc::Status status;
  call_->Finish(&status, nullptr);
  Wait();
  return status;
}

}  // namespace conveyor::client
