#include "client/internal/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/fd_passing.h"
#include "base/shm_layout.h"
#include "client/internal/carrier.h"

namespace conveyor::client {

namespace {

absl::Status Failed(const std::string& socket, const std::string& step) {
  return absl::UnavailableError(absl::StrCat("shared memory from ", socket, ": ", step,
                                             errno ? absl::StrCat(" (", std::strerror(errno), ")") : ""));
}

}  // namespace

absl::StatusOr<std::shared_ptr<ShmRegion>> ShmRegion::Receive(const std::string& socket_path, const std::string& token,
                                                              uint64_t ring, uint64_t max_ring) {
  errno = 0;
  const std::string dir = std::string(shm::kSocketDir) + "/" + shm::kNamePrefix;
  if (socket_path.compare(0, dir.size(), dir) != 0 || socket_path.find("..") != std::string::npos ||
      socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Failed(socket_path.substr(0, 128), "not a socket Conveyor makes");
  }
  if (token.size() != shm::kTokenBytes || ring == 0 || ring % shm::kAlign != 0 || ring > max_ring) {
    return Failed(socket_path, absl::StrCat("a token of ", token.size(), " bytes and a ring of ", ring,
                                            " bytes (this client accepts ", max_ring, ")"));
  }
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return Failed(socket_path, "socket");
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } sock_closer{sock}, fd_closer{-1};
  timeval tv{5, 0};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return Failed(socket_path, "connect");
  if (send(sock, token.data(), token.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(token.size())) {
    return Failed(socket_path, "sending the token");
  }
  const int fd = ReceiveFd(sock);
  if (fd < 0) return Failed(socket_path, "no descriptor came back");
  fd_closer.fd = fd;
  auto refuse = [&](const std::string& why) {
    const char no = 0;
    send(sock, &no, 1, MSG_NOSIGNAL);
    return Failed(socket_path, why);
  };
  // What is mapped must stay: a region the server could still shrink would turn this process's
  // reads into SIGBUS.
  struct stat st {};
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL)) {
    return refuse("the region is not sealed against shrinking");
  }
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != shm::kHeaderBytes + ring) {
    return refuse(absl::StrCat("the region is not ", shm::kHeaderBytes + ring, " bytes"));
  }
  std::shared_ptr<ShmRegion> r(new ShmRegion());
  void* h = mmap(nullptr, shm::kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (h == MAP_FAILED) return refuse("mapping its header");
  r->header_ = static_cast<uint8_t*>(h);
  // Writable: a trainer may change its batch in place, as it may a batch that came in messages.
  // Only its own batch's bytes change: the server writes the ring and never reads it back.
  void* d = mmap(nullptr, ring, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(shm::kHeaderBytes));
  if (d == MAP_FAILED) return refuse("mapping its ring");
  r->data_ = static_cast<uint8_t*>(d);
  r->data_mapped_ = ring;
  r->ring_ = ring;
  uint64_t header_ring = 0;
  std::memcpy(&header_ring, r->header_ + shm::kRingOffset, 8);
  if (std::memcmp(r->header_ + shm::kMagicOffset, shm::kMagic, 8) != 0 || header_ring != ring) {
    return refuse("its header is not a Conveyor region of that ring");
  }
  const char yes = 1;
  if (send(sock, &yes, 1, MSG_NOSIGNAL) != 1) return Failed(socket_path, "confirming");
  return r;
}

ShmRegion::~ShmRegion() {
  if (header_ != nullptr) munmap(header_, shm::kHeaderBytes);
  if (data_ != nullptr) munmap(data_, data_mapped_);
}

void ShmRegion::SetStarved(bool starved) {
  reinterpret_cast<std::atomic<uint64_t>*>(header_ + shm::kStarvedOffset)->store(starved ? 1 : 0,
                                                                                std::memory_order_release);
}

absl::StatusOr<const uint8_t*> ShmRegion::Accept(uint64_t pos, uint64_t n) {
  absl::MutexLock lock(&mu_);
  // Payloads start on pages: what lies between a released payload's end and the next page was
  // never used, so the ring is free up to that page.
  const uint64_t free_to = (released_ + shm::kAlign - 1) / shm::kAlign * shm::kAlign + ring_;
  if (n == 0 || n > ring_ || pos % shm::kAlign != 0 || pos < shm::PlaceAfter(head_, n, ring_) ||
      pos % ring_ + n > ring_ || pos > UINT64_MAX - ring_ || pos + n > free_to) {
    return absl::DataLossError(absl::StrCat("a payload of ", n, " bytes at shared memory position ", pos,
                                            " where the next may start at ", head_, " (", released_,
                                            " released of a ", ring_, "-byte ring)"));
  }
  in_use_.push_back(InUse{pos, pos + n, false});
  head_ = pos + n;
  return data_ + pos % ring_;
}

void ShmRegion::Release(uint64_t pos) {
  absl::MutexLock lock(&mu_);
  for (InUse& u : in_use_) {
    if (u.pos == pos) {
      u.released = true;
      break;
    }
  }
  uint64_t released = released_;
  while (!in_use_.empty() && in_use_.front().released) {
    released = in_use_.front().end;
    in_use_.pop_front();
  }
  if (released != released_) {
    released_ = released;
    // Read by the server from its mapping: an aligned 8-byte store, published after the reads of the
    // released payloads (the release fence orders them before it).
    std::atomic_thread_fence(std::memory_order_release);
    reinterpret_cast<std::atomic<uint64_t>*>(header_ + shm::kReleasedOffset)->store(released, std::memory_order_release);
  }
}

uint64_t ShmRegion::released() const {
  absl::MutexLock lock(&mu_);
  return released_;
}

namespace {

// This host as the same-host transport sees it (base/shm_layout.h), read once.
const std::string& HostId() {
  static const std::string* id = new std::string(shm::HostId());
  return *id;
}

// The stream's batches placed in its region: each is one message (its header, its position,
// last) and viewed where it lies.
class RegionSource final : public PayloadSource, public std::enable_shared_from_this<RegionSource> {
 public:
  RegionSource(std::shared_ptr<ShmRegion> region, std::string target)
      : region_(std::move(region)), target_(std::move(target)) {}
  std::string_view transport() const override { return "shared_memory"; }
  bool Carries(const wire::Message& m) const override { return m.in_shared_memory; }

  absl::Status Take(wire::Message& m, InboundPayload* p) override {
    if (!m.header || !m.last || m.data_at || !m.in_shared_memory) {
      return absl::DataLossError(absl::StrCat("server ", target_, " sent a shared-memory batch with payload messages"));
    }
    absl::StatusOr<const uint8_t*> at = region_->Accept(m.shm_position, p->bytes);
    if (!at.ok()) return absl::DataLossError(absl::StrCat("server ", target_, ": ", at.status().message()));
    p->storage = std::make_shared<BatchStorage>();
    p->storage->source = shared_from_this();
    p->storage->source_position = m.shm_position;
    p->storage->source_data = *at;
    p->filled = p->bytes;
    return absl::OkStatus();
  }
  void Release(uint64_t pos) override { region_->Release(pos); }
  void SetStarved(bool starved) override { region_->SetStarved(starved); }

 private:
  std::shared_ptr<ShmRegion> region_;
  std::string target_;
};

}  // namespace

bool OfferSharedMemory(const ClientOptions& o, v1::StreamBatchesRequest* request, std::string* refused) {
  if (!o.shared_memory) return false;
  if (HostId().empty()) {
    *refused = "this host has no /dev/shm";
    return false;
  }
  v1::SharedMemoryOffer* offer = request->mutable_shared_memory();
  offer->set_server_region(true);
  offer->set_host(HostId());
  offer->set_capacity(o.shared_memory_bytes);
  // What this client holds unreleased in steady state: its prefetch and the trainer's batch.
  offer->set_batches_ahead(static_cast<uint32_t>(o.prefetch_batches + 1));
  return true;
}

// A new region per stream (the server creates it): a server that went away can never write into
// the next stream's. Taken now, before the first batch: the server waits for the answer, and
// without the region its payloads come in messages.
absl::StatusOr<std::shared_ptr<PayloadSource>> AcceptSharedMemory(const CarrierStream& stream,
                                                                  const v1::StreamStart& start, std::string* refused) {
  *refused = start.shared_memory_refused();
  if (!start.shared_memory()) return nullptr;
  absl::StatusOr<std::shared_ptr<ShmRegion>> region =
      ShmRegion::Receive(start.shared_memory_socket(), start.shared_memory_token(), start.shared_memory_ring(),
                         stream.options->shared_memory_bytes);
  if (!region.ok()) {
    *refused = std::string(region.status().message());
    return nullptr;
  }
  return std::make_shared<RegionSource>(*std::move(region), stream.target);
}

}  // namespace conveyor::client
