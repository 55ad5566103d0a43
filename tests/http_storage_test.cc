// The HTTP backend against a real nginx, directly and through a fault-injecting proxy.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "base/cancel.h"
#include "storage/storage.h"
#include "tests/support/fault_proxy.h"
#include "tests/support/nginx_server.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::FaultAction;
using testing::FaultProxy;
using testing::NginxServer;
using testing::TempDir;

constexpr char kFileName[] = "data.bin";
// Not a multiple of any buffer size, so the last range is a ragged one.
constexpr size_t kFileSize = 3 * 1024 * 1024 + 17;

// Timeouts and backoffs small enough that failing tests finish in seconds.
HttpOptions FastOptions() {
  HttpOptions options;
  options.connect_timeout_ms = 2000;
  options.stall_timeout_ms = 1000;
  options.max_attempts = 3;
  options.base_backoff_ms = 1;
  options.max_backoff_ms = 10;
  return options;
}

class HttpStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(20240611);
    bytes_.resize(kFileSize);
    for (char& c : bytes_) c = static_cast<char>(rng());
    testing::WriteFile(dir_.Join(kFileName), bytes_);
    std::filesystem::create_directory(dir_.Join("subdir"));
    auto server = NginxServer::Start(dir_.path());
    ASSERT_TRUE(server.ok()) << server.status();
    nginx_ = std::move(*server);
  }

  std::unique_ptr<Storage> Connect(const std::string& base_url,
                                   const HttpOptions& options = FastOptions()) {
    auto storage = NewHttpStorage(base_url, options);
    EXPECT_TRUE(storage.ok()) << storage.status();
    return storage.ok() ? std::move(*storage) : nullptr;
  }

  std::unique_ptr<FaultProxy> StartProxy() {
    auto proxy = FaultProxy::Start(nginx_->port());
    EXPECT_TRUE(proxy.ok()) << proxy.status();
    return proxy.ok() ? std::move(*proxy) : nullptr;
  }

  // Reads [offset, offset + n) and compares it with the local bytes.
  void ExpectRange(const RandomAccessFile& file, uint64_t offset, size_t n) {
    std::string got(n, '\0');
    absl::Status s = file.Read(offset, n, got.data());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(got == bytes_.substr(offset, n)) << "bytes differ in range " << offset << "+" << n;
  }

  TempDir dir_;
  std::string bytes_;
  std::unique_ptr<NginxServer> nginx_;
};

TEST_F(HttpStorageTest, ReadsExactRanges) {
  // OpenStorage dispatches on the scheme and appends the missing '/'.
  std::string base = nginx_->base_url();
  base.pop_back();
  auto storage = OpenStorage(base, FastOptions());
  ASSERT_TRUE(storage.ok()) << storage.status();
  EXPECT_EQ((*storage)->Describe(kFileName), nginx_->base_url() + kFileName);

  auto file = (*storage)->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), kFileSize);
  EXPECT_EQ((*file)->name(), nginx_->base_url() + kFileName);

  const std::vector<std::pair<uint64_t, size_t>> ranges = {
      {0, 1},          {kFileSize - 1, 1}, {0, kFileSize},
      {12345, 100000}, {1 << 20, 1 << 20}, {kFileSize - 1000, 1000},
      {7, 65536 + 3}};
  for (const auto& [offset, n] : ranges) ExpectRange(**file, offset, n);

  uint64_t total = 0;
  for (const auto& range : ranges) total += range.second;
  const StorageStats stats = (*storage)->stats();
  EXPECT_EQ(stats.reads, ranges.size());
  EXPECT_EQ(stats.bytes_read, total);
  EXPECT_EQ(stats.retries, 0u);
}

TEST_F(HttpStorageTest, ZeroLengthReadSendsNoRequest) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  auto storage = Connect(proxy->base_url());
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->Read(kFileSize, 0, nullptr).ok());
  EXPECT_TRUE((*file)->Read(10, 0, nullptr).ok());
  EXPECT_EQ(proxy->requests_seen(), 1);  // the HEAD of Open only
}

TEST_F(HttpStorageTest, SequentialReadsReuseOneConnection) {
  auto storage = Connect(nginx_->base_url());
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  for (int i = 0; i < 50; ++i) ExpectRange(**file, static_cast<uint64_t>(i) * 60001, 4096);
  const StorageStats stats = storage->stats();
  EXPECT_EQ(stats.reads, 50u);
  EXPECT_EQ(stats.connections_opened, 1u);  // the HEAD and the 50 GETs on one connection
}

TEST_F(HttpStorageTest, ConcurrentReadsFromFourThreads) {
  auto storage = Connect(nginx_->base_url());
  ASSERT_NE(storage, nullptr);
  auto opened = storage->Open(kFileName);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const RandomAccessFile& file = **opened;

  constexpr int kThreads = 4;
  constexpr int kReadsPerThread = 40;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::string got;
      for (int i = 0; i < kReadsPerThread; ++i) {
        const size_t n = 1 + rng() % (256 * 1024);
        const uint64_t offset = rng() % (kFileSize - n + 1);
        got.assign(n, '\0');
        absl::Status s = file.Read(offset, n, got.data());
        if (!s.ok()) {
          errors[t] = std::string(s.message());
          return;
        }
        if (got != bytes_.substr(offset, n)) ++mismatches[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
  const StorageStats stats = storage->stats();
  EXPECT_EQ(stats.reads, static_cast<uint64_t>(kThreads * kReadsPerThread));
  // At most one handle, hence one connection, per thread reading at once.
  EXPECT_LE(stats.connections_opened, static_cast<uint64_t>(kThreads));
}

TEST_F(HttpStorageTest, RetriesA503) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  auto storage = Connect(proxy->base_url());
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue(FaultAction::Respond503());
  ExpectRange(**file, 1000, 50000);
  EXPECT_EQ(storage->stats().retries, 1u);
  EXPECT_EQ(proxy->requests_seen(), 3);  // HEAD, the 503, the GET that worked
}

TEST_F(HttpStorageTest, RetriesABodyCutShort) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  auto storage = Connect(proxy->base_url());
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue(FaultAction::CutBodyAfter(1000));
  ExpectRange(**file, 777, 200000);
  EXPECT_EQ(storage->stats().retries, 1u);
  EXPECT_EQ(storage->stats().bytes_read, 200000u);
}

TEST_F(HttpStorageTest, RetriesAResetConnection) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  auto storage = Connect(proxy->base_url());
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue(FaultAction::Reset());
  ExpectRange(**file, 0, 4096);
  EXPECT_EQ(storage->stats().retries, 1u);
}

TEST_F(HttpStorageTest, RetriesAStall) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  auto storage = Connect(proxy->base_url());  // stall_timeout_ms = 1000
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue(FaultAction::Stall(3000));
  ExpectRange(**file, 5000, 10000);
  EXPECT_EQ(storage->stats().retries, 1u);
}

TEST_F(HttpStorageTest, StallOnEveryAttemptIsDeadlineExceeded) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  HttpOptions options = FastOptions();
  options.max_attempts = 2;
  auto storage = Connect(proxy->base_url(), options);
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue({FaultAction::Stall(3000), FaultAction::Stall(3000)});
  std::string buf(100, '\0');
  absl::Status s = (*file)->Read(0, 100, buf.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), proxy->base_url() + kFileName)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "bytes=0-99")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "2 attempts")) << s;
}

// A store that answers but trickles one byte a second holds no worker for long: under the minimum
// speed for stall_timeout_ms, an attempt is abandoned; all attempts so is the read, naming it.
TEST_F(HttpStorageTest, ATrickleOfOneBytePerSecondIsAbandoned) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  HttpOptions options = FastOptions();
  options.max_attempts = 2;
  auto storage = Connect(proxy->base_url(), options);
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue({FaultAction::Trickle(1000), FaultAction::Trickle(1000)});
  std::string buf(10000, '\0');
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = (*file)->Read(0, buf.size(), buf.data());
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "bytes=0-9999")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "2 attempts")) << s;
  // Not a timing assertion: a bound that only an unbounded trickle (10000 s) would break.
  EXPECT_LT(waited, 120) << "the trickle held the read for " << waited << " s";
}

// The per-attempt deadline holds even when bytes arrive fast enough to pass the speed check.
TEST_F(HttpStorageTest, EveryAttemptHasADeadline) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  HttpOptions options = FastOptions();
  options.max_attempts = 1;
  options.min_bytes_per_s = 1;      // a byte every 10 ms passes the speed check
  options.stall_timeout_ms = 60000;
  options.request_timeout_ms = 1500;
  auto storage = Connect(proxy->base_url(), options);
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue(FaultAction::Trickle(10));
  std::string buf(10000, '\0');
  absl::Status s = (*file)->Read(0, buf.size(), buf.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

// Cancellation reaches a transfer in flight: the pipeline's worker sets its flag (base/cancel.h)
// and the read returns CANCELLED, without waiting for the store.
TEST_F(HttpStorageTest, CancellationAbortsATransferInFlight) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  HttpOptions options = FastOptions();
  options.stall_timeout_ms = 60000;
  options.min_bytes_per_s = 1;
  auto storage = Connect(proxy->base_url(), options);
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue(FaultAction::Trickle(200));
  std::atomic<bool> cancel{false};
  absl::Status s;
  std::thread reader([&] {
    CancelScope scope(&cancel);
    std::string buf(10000, '\0');
    s = (*file)->Read(0, buf.size(), buf.data());
  });
  while (proxy->requests_seen() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // mid-transfer
  cancel = true;
  reader.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(storage->stats().retries, 0u) << "a cancelled read was retried";
}

TEST(HttpStorage, CredentialsInTheUrlNeverAppearInNames) {
  EXPECT_EQ(RedactUri("https://user:s3cret@host:8080/ds/"), "https://***@host:8080/ds/");
  EXPECT_EQ(RedactUri("http://host/a@b/c"), "http://host/a@b/c");  // '@' in the path is no userinfo
  EXPECT_EQ(RedactUri("/local/path"), "/local/path");
  auto storage = NewHttpStorage("http://user:s3cret@127.0.0.1:9/ds/", FastOptions());
  ASSERT_TRUE(storage.ok());
  EXPECT_EQ((*storage)->Describe("manifest.json"), "http://***@127.0.0.1:9/ds/manifest.json");
  HttpOptions one = FastOptions();
  one.max_attempts = 1;
  auto refused = NewHttpStorage("http://user:s3cret@127.0.0.1:9/ds/", one);
  ASSERT_TRUE(refused.ok());
  auto f = (*refused)->Open("manifest.json");
  ASSERT_FALSE(f.ok());
  EXPECT_FALSE(absl::StrContains(f.status().message(), "s3cret")) << f.status();
}

TEST_F(HttpStorageTest, MissingFileIsNotFoundWithoutRetries) {
  auto storage = Connect(nginx_->base_url());
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open("no/such/file.bin");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound) << file.status();
  EXPECT_TRUE(absl::StrContains(file.status().message(), nginx_->base_url() + "no/such/file.bin"))
      << file.status();
  EXPECT_TRUE(absl::StrContains(file.status().message(), "404")) << file.status();
  EXPECT_EQ(storage->stats().retries, 0u);
}

TEST_F(HttpStorageTest, ForbiddenIsPermissionDeniedWithoutRetries) {
  // nginx answers 403 for a directory with no index file (autoindex is off).
  auto storage = Connect(nginx_->base_url());
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open("subdir/");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kPermissionDenied) << file.status();
  EXPECT_TRUE(absl::StrContains(file.status().message(), nginx_->base_url() + "subdir/"))
      << file.status();
  EXPECT_TRUE(absl::StrContains(file.status().message(), "403")) << file.status();
  EXPECT_EQ(storage->stats().retries, 0u);
}

TEST_F(HttpStorageTest, Always503IsUnavailableAfterMaxAttempts) {
  // Through a pass-through proxy, which counts the requests nginx got.
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  auto storage = Connect(proxy->base_url());  // max_attempts = 3
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open("always503/data.bin");
  const absl::Status& s = file.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), proxy->base_url() + "always503/data.bin")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "503")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "3 attempts")) << s;
  EXPECT_EQ(proxy->requests_seen(), 3);
  EXPECT_EQ(storage->stats().retries, 2u);
}

TEST_F(HttpStorageTest, ReadGivesUpAfterMaxAttempts) {
  auto proxy = StartProxy();
  ASSERT_NE(proxy, nullptr);
  auto storage = Connect(proxy->base_url());  // max_attempts = 3
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  proxy->Enqueue({FaultAction::Respond503(), FaultAction::Reset(), FaultAction::Respond503(),
                  FaultAction::PassThrough()});
  std::string buf(10, '\0');
  absl::Status s = (*file)->Read(100, 10, buf.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), proxy->base_url() + kFileName)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "bytes=100-109")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "HTTP status 503")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "3 attempts")) << s;
  EXPECT_EQ(proxy->actions_left(), 1u);  // the fourth action was never needed
  EXPECT_EQ(storage->stats().reads, 0u);
}

TEST_F(HttpStorageTest, UnreachableServerIsUnavailable) {
  // A port nothing listens on: every attempt is refused at once, and backoffs are milliseconds.
  auto port = testing::PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  const std::string base = "http://127.0.0.1:" + std::to_string(*port) + "/";
  auto storage = Connect(base);
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  const absl::Status& s = file.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), base + kFileName)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "connect")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "3 attempts")) << s;
  EXPECT_EQ(storage->stats().retries, 2u);
}

TEST_F(HttpStorageTest, ReadPastEndIsOutOfRange) {
  auto storage = Connect(nginx_->base_url());
  ASSERT_NE(storage, nullptr);
  auto file = storage->Open(kFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  std::string buf(20, '\0');
  absl::Status s = (*file)->Read(kFileSize - 10, 11, buf.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), nginx_->base_url() + kFileName)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), std::to_string(kFileSize))) << s;
  EXPECT_EQ((*file)->Read(kFileSize + 1, 0, buf.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*file)->Read(UINT64_MAX, 2, buf.data()).code(), absl::StatusCode::kOutOfRange);
}

TEST(HttpStorage, RejectsBadRootsAndOptions) {
  EXPECT_EQ(NewHttpStorage("ftp://host/x", {}).status().code(), absl::StatusCode::kInvalidArgument);
  HttpOptions options;
  options.max_attempts = 0;
  EXPECT_EQ(NewHttpStorage("http://127.0.0.1/", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor
