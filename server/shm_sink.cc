#include "server/internal/shm_sink.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "base/fd_passing.h"
#include "base/shm_layout.h"
#include "base/strings.h"
#include "server/internal/carrier.h"
#include "server/internal/peer_identity.h"

namespace conveyor {

// The memfd and its mapping: kept alive by the sink and by every batch buffer borrowed from it.
struct SharedMemorySink::Region {
  int fd = -1;
  uint8_t* base = nullptr;
  size_t size = 0;
  ~Region() {
    if (base != nullptr) munmap(base, size);
    if (fd >= 0) close(fd);
  }
};

namespace {

std::string RandomHex(size_t bytes, std::string* raw = nullptr) {
  std::random_device rd;
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned v = rd() & 0xff;
    hex += kHex[v >> 4];
    hex += kHex[v & 15];
    if (raw) *raw += static_cast<char>(v);
  }
  return hex;
}

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(StrCat(what, ": ", std::strerror(errno)));
}

// Reads exactly `n` bytes (the socket has a receive timeout); false on timeout, error or EOF.
bool ReadFull(int fd, void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemorySink>> SharedMemorySink::Create(uint64_t ring, uint32_t batches_ahead,
                                                                           uint64_t max_message) {
  std::unique_ptr<SharedMemorySink> s(new SharedMemorySink());
  s->ring_ = std::max<uint64_t>(shm::kAlign, ring / shm::kAlign * shm::kAlign);
  s->batches_ahead_ = std::max<uint32_t>(1, batches_ahead);
  s->max_message_ = max_message;
  auto region = std::make_shared<Region>();
  region->fd = memfd_create("conveyor-stream", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (region->fd < 0) return Errno("memfd_create");
  region->size = shm::kHeaderBytes + s->ring_;
  if (ftruncate(region->fd, static_cast<off_t>(region->size)) != 0) {
    return Errno(StrCat("sizing the shared region to ", region->size, " bytes"));
  }
  if (fcntl(region->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Errno("sealing the shared region");
  }
  void* p = mmap(nullptr, region->size, PROT_READ | PROT_WRITE, MAP_SHARED, region->fd, 0);
  if (p == MAP_FAILED) return Errno("mapping the shared region");
  region->base = static_cast<uint8_t*>(p);
  std::memcpy(region->base + shm::kMagicOffset, shm::kMagic, 8);
  std::memcpy(region->base + shm::kRingOffset, &s->ring_, 8);
  s->data_ = region->base + shm::kHeaderBytes;
  s->region_ = std::move(region);

  // The handoff socket: a random name under /dev/shm (reachable by processes that share this
  // /dev/shm, as the client's HostId said it does), owner-only.
  s->socket_path_ = StrCat(shm::kSocketDir, "/", shm::kNamePrefix, RandomHex(16), ".sock");
  RandomHex(shm::kTokenBytes, &s->token_);
  s->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->listen_fd_ < 0) return Errno("socket(AF_UNIX)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, s->socket_path_.c_str(), s->socket_path_.size() + 1);
  if (bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const absl::Status e = Errno(StrCat("binding ", s->socket_path_));
    close(s->listen_fd_);
    s->listen_fd_ = -1;
    return e;
  }
  chmod(s->socket_path_.c_str(), 0600);
  if (listen(s->listen_fd_, 4) != 0) return Errno(StrCat("listening on ", s->socket_path_));
  return s;
}

SharedMemorySink::~SharedMemorySink() { CloseSocket(); }

void SharedMemorySink::CloseSocket() {
  if (listen_fd_ < 0) return;
  close(listen_fd_);
  listen_fd_ = -1;
  unlink(socket_path_.c_str());
}

absl::Status SharedMemorySink::Handoff(absl::Duration timeout, const StopFn& stop) {
  struct Closer {
    SharedMemorySink* s;
    ~Closer() { s->CloseSocket(); }
  } closer{this};
  const absl::Time deadline = absl::Now() + timeout;
  int turned_away = 0;
  while (absl::Now() < deadline) {
    if (stop()) return absl::CancelledError("the stream ended before the client took its shared region");
    pollfd pfd{listen_fd_, POLLIN, 0};
    const int ready = poll(&pfd, 1, 50);
    if (ready < 0 && errno != EINTR) return Errno("poll on the handoff socket");
    if (ready <= 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    // A peer gets two seconds for each of its two steps: a slow or silent one is turned away.
    timeval tv{2, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string token(shm::kTokenBytes, '\0');
    char ack = 0;
    const bool ok = ReadFull(conn, token.data(), token.size()) && token == token_ &&
                    SendFd(conn, region_->fd) && ReadFull(conn, &ack, 1);
    close(conn);
    if (ok && ack == 1) {
      handed_ = true;
      return absl::OkStatus();
    }
    if (ok) return absl::FailedPreconditionError("the client could not map the shared region it was given");
    ++turned_away;
  }
  return absl::DeadlineExceededError(StrCat("no client took the shared region within ", absl::FormatDuration(timeout),
                                            turned_away ? StrCat(" (", turned_away, " peers turned away)") : ""));
}

uint64_t SharedMemorySink::Released() const {
  const uint64_t claimed = reinterpret_cast<const std::atomic<uint64_t>*>(region_->base + shm::kReleasedOffset)
                               ->load(std::memory_order_acquire);
  // The client publishes the end of its last released payload; the buffer it lay in ended at
  // most at the next page. A client claiming more than was placed only hurts itself.
  const uint64_t rounded = claimed > UINT64_MAX - shm::kAlign ? claimed : (claimed + shm::kAlign - 1) / shm::kAlign * shm::kAlign;
  return std::min(rounded, head_);
}

bool SharedMemorySink::Starved() const {
  return reinterpret_cast<const std::atomic<uint64_t>*>(region_->base + shm::kStarvedOffset)
             ->load(std::memory_order_acquire) != 0;
}

BatchBuffers SharedMemorySink::buffers(StopFn stop) {
  return [this, stop = std::move(stop)](size_t bytes) { return Allocate(bytes, stop); };
}

absl::StatusOr<std::shared_ptr<HostBuffer>> SharedMemorySink::Allocate(size_t bytes, const StopFn& stop) {
  if (!handed_ || bytes == 0 || bytes > ring_) return HostBuffer::Allocate(bytes, false);
  const uint64_t pos = shm::PlaceAfter(head_, bytes, ring_);
  // Wait until [pos, pos + bytes) lies within one lap of what the client released and fewer than
  // batches_ahead placed batches are unreleased. A client that is merely slower makes the server
  // wait here, as gRPC flow control would; one that keeps every batch it was given would wait
  // for the server forever, so when it says it is starved the batch is built outside the ring.
  const auto t0 = std::chrono::steady_clock::now();
  bool waited = false;
  for (int sleep_us = 20;; sleep_us = std::min(sleep_us * 2, 2000)) {
    const uint64_t released = Released();
    while (!unreleased_.empty() && unreleased_.front() <= released) unreleased_.pop_front();
    if (pos + bytes <= released + ring_ && unreleased_.size() < batches_ahead_) break;
    if (stop()) {
      wait_seconds_ += Since(t0);
      return absl::CancelledError("the stream ended while the client's shared region was full");
    }
    if (Starved()) {
      if (waited) wait_seconds_ += Since(t0);
      ++full_batches_;
      return HostBuffer::Allocate(bytes, false);
    }
    waited = true;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
  if (waited) wait_seconds_ += Since(t0);
  head_ = pos + bytes;
  unreleased_.push_back(head_);
  uint8_t* at = data_ + pos % ring_;
  last_ = Placed{at, pos};
  return HostBuffer::Borrow(at, bytes, region_);
}

absl::Status SharedMemorySink::Send(const Batch& batch, const Cursor& next, const MessageWriter& write) {
  std::optional<uint64_t> at;
  if (last_ && batch.buffer && batch.buffer->data() == last_->data) {
    // The payload starts at the first tensor; the client expects it at the buffer's start.
    size_t base = SIZE_MAX;
    for (const TensorView& t : batch.tensors) base = std::min(base, t.offset);
    if (base == 0) at = last_->pos;
  }
  if (last_ && !at && !unreleased_.empty()) {
    // Placed but going in messages after all (a payload not at its buffer's start; the stacked
    // and packed batches never do that): the client never sees it, so it is not waited for. Its
    // bytes stay a gap the client skips, since gRPC may still be sending them from there.
    unreleased_.pop_back();
  }
  last_.reset();
  if (at) ++region_batches_;
  return EncodeBatch(batch, next, max_message_, write, at);
}

namespace {

// The ring of a stream's same-host region, or why it gets none
// (StreamStart.shared_memory_refused). Room for the batches the client may hold unreleased,
// the one being built and one skipped at the ring's end, from the config's estimate of a
// batch; at most what the client accepts and the stream's byte budget.
absl::StatusOr<uint64_t> SharedMemoryRing(const CarrierRequest& r, const CarrierServer& server) {
  const v1::SharedMemoryOffer& offer = r.request->shared_memory();
  if (!server.shared_memory) return absl::FailedPreconditionError("the server runs with --shared-memory=false");
  if (!offer.server_region()) {
    return absl::FailedPreconditionError(
        "the client offers a region of its own, which this server no longer writes into: upgrade the client");
  }
  static const std::string host = shm::HostId();
  if (host.empty() || offer.host() != host) {
    return absl::FailedPreconditionError(StrCat("the client runs on another host or with another /dev/shm (client ",
                                                offer.host().substr(0, 128), ", server ", host, ")"));
  }
  // The region's socket is private to this server's user (0600): a client of another user
  // (admitted by --allow-uid, --allow-group or --loopback-open) could not open it, and the
  // stream would wait for it in vain before its payloads came in messages.
  if (const std::optional<uid_t> uid =
          server_internal::LocalPeerUid(r.ctx->peer(), server.listen_host, server.listen_port);
      uid && *uid != geteuid() && *uid != 0) {
    return absl::FailedPreconditionError(
        StrCat("the client runs as local user ", server_internal::DescribeUid(*uid),
               " and a same-host region's socket is private to this server's user (",
               server_internal::DescribeUid(geteuid()), "): payloads come in messages"));
  }
  if (offer.capacity() < shm::kAlign) {
    return absl::FailedPreconditionError(StrCat("the client accepts a ring of ", offer.capacity(), " bytes"));
  }
  const uint64_t batch = (r.batch_bytes + r.batch_bytes / 8 + shm::kAlign) / shm::kAlign * shm::kAlign;
  const uint64_t batches = std::clamp<uint64_t>(offer.batches_ahead(), 1, 64) + 2;
  const uint64_t wanted = batch > UINT64_MAX / batches ? UINT64_MAX : batch * batches;
  return std::max<uint64_t>(shm::kAlign,
                            std::min({offer.capacity(), r.queue_bytes, wanted}) / shm::kAlign * shm::kAlign);
}

class SharedMemoryGrant final : public CarrierGrant {
 public:
  SharedMemoryGrant(std::unique_ptr<SharedMemorySink> sink, const CarrierRequest& r)
      : sink_(std::move(sink)), ctx_(r.ctx), who_(r.who) {}

  // The client connects as soon as it reads the stream start; meanwhile the workers decode.
  absl::StatusOr<std::unique_ptr<PayloadSink>> Connect(const StopFn& stop) override {
    if (absl::Status h = sink_->Handoff(absl::Seconds(5), stop); !h.ok()) {
      if (ctx_->IsCancelled()) return absl::CancelledError("the client went away");
      spdlog::warn("{}: the client did not take its shared region ({}); payloads go in messages", who_,
                   std::string(h.message()));
      return nullptr;
    }
    return std::move(sink_);
  }

 private:
  std::unique_ptr<SharedMemorySink> sink_;
  grpc::ServerContext* ctx_;
  std::string who_;
};

}  // namespace

bool AsksSharedMemory(const v1::StreamBatchesRequest& request) { return request.has_shared_memory(); }

// The ring's pages are the stream's too: admitted with the stream, or the stream goes without.
std::unique_ptr<CarrierGrant> GrantSharedMemory(const CarrierRequest& r, CarrierServer& server,
                                                v1::StreamStart* start) {
  absl::StatusOr<uint64_t> ring = SharedMemoryRing(r, server);
  if (ring.ok() && !r.reserve_memory(*ring)) {
    ring = absl::ResourceExhaustedError(StrCat("this server's memory budget has no room for a shared ring of ",
                                               *ring, " bytes beside the stream's ", r.stream_bytes));
  }
  absl::StatusOr<std::unique_ptr<SharedMemorySink>> sink =
      ring.ok() ? SharedMemorySink::Create(*ring, r.request->shared_memory().batches_ahead(), r.max_message)
                : absl::StatusOr<std::unique_ptr<SharedMemorySink>>(ring.status());
  if (!sink.ok()) {
    start->set_shared_memory_refused(std::string(sink.status().message()));
    return nullptr;
  }
  start->set_shared_memory(true);
  start->set_shared_memory_ring((*sink)->ring());
  start->set_shared_memory_socket((*sink)->socket_path());
  start->set_shared_memory_token((*sink)->token());
  return std::make_unique<SharedMemoryGrant>(*std::move(sink), r);
}

}  // namespace conveyor
