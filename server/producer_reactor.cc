#include "server/producer_reactor.h"

namespace conveyor {

ProducerReactor::ProducerReactor(Produce produce, std::function<void()> on_cancel,
                                 std::function<void()> on_done)
    : produce_(std::move(produce)), on_cancel_(std::move(on_cancel)), on_done_(std::move(on_done)) {
  // Operations started before the reactor is bound to its call are held by gRPC until it is.
  thread_ = std::thread([this] { Finish(produce_(this)); });
}

bool ProducerReactor::Write(grpc::ByteBuffer message) {
  std::unique_lock<std::mutex> lock(mu_);
  if (cancelled_ || !write_ok_) return false;
  message_ = std::move(message);
  writing_ = true;
  lock.unlock();
  StartWrite(&message_);
  lock.lock();
  cv_.wait(lock, [&] { return !writing_; });
  return write_ok_ && !cancelled_;
}

bool ProducerReactor::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void ProducerReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  write_ok_ = write_ok_ && ok;
  cv_.notify_all();
}

void ProducerReactor::OnCancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }
  if (on_cancel_) on_cancel_();
}

void ProducerReactor::OnDone() {
  // Finish() was the producer's last act; its thread is returning.
  if (thread_.joinable()) thread_.join();
  if (on_done_) on_done_();
  delete this;
}

}  // namespace conveyor
