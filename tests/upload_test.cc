// Tests for device/upload.h (the one GPU upload path) and HostBuffer (device/host_buffer.h).
//
// Everything but the GPU tests runs on any machine: the CPU path is forced with device = -1, and
// the default options take whichever path the machine offers. The GPU tests copy the device
// memory back with a plain cudaMemcpy and compare bytes; they skip (with the reason) when the
// build has no CUDA or the machine no usable GPU.
#include "device/upload.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/host_buffer.h"
#include "gtest/gtest.h"

#if CONVEYOR_HAVE_CUDA
#include "device/internal/cuda.h"
#endif

namespace conveyor {
namespace {

constexpr size_t kMiB = 1024 * 1024;

// Bytes per element. Spelled out here rather than taken from media/, so this test's binary
// needs nothing of the decoders: it is also run on GPU machines.
size_t ElementBytes(DType t) { return t == DType::kFloat32 || t == DType::kInt32 ? 4 : 1; }

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// What a test batch's owner keeps: the host buffer, the tensors as they were handed over, and
// the seed that made the bytes.
struct HostSide {
  std::shared_ptr<HostBuffer> buffer;
  std::vector<HostTensor> tensors;
  uint64_t seed = 0;
  const uint8_t* data(const HostTensor& t) const { return buffer->data() + t.offset; }
};

// A batch whose tensors sit at 64-byte aligned offsets of one host buffer, filled with bytes
// that depend on `seed` and the position (the gaps between tensors hold other bytes, 0xEE).
std::shared_ptr<HostSide> MakeHost(const std::vector<TensorSpec>& specs, uint64_t seed,
                                   bool pinned = true) {
  auto host = std::make_shared<HostSide>();
  host->seed = seed;
  size_t offset = 0;
  for (const TensorSpec& s : specs) {
    size_t elements = 1;
    for (int64_t d : s.shape) elements *= static_cast<size_t>(d);
    host->tensors.push_back(HostTensor{{.name = s.name, .dtype = s.dtype, .shape = s.shape},
                                       offset,
                                       elements * ElementBytes(s.dtype)});
    offset = (offset + host->tensors.back().bytes + 63) / 64 * 64;
  }
  host->buffer = HostBuffer::Allocate(offset, pinned);
  std::memset(host->buffer->data(), 0xEE, offset);
  std::mt19937_64 rng(seed);
  for (const HostTensor& t : host->tensors) {
    uint8_t* p = host->buffer->data() + t.offset;
    for (size_t i = 0; i < t.bytes; ++i) p[i] = static_cast<uint8_t>(rng());
  }
  return host;
}

HostBatch MakeBatch(const std::vector<TensorSpec>& specs, uint64_t seed, bool pinned = true) {
  std::shared_ptr<HostSide> host = MakeHost(specs, seed, pinned);
  HostBatch batch;
  batch.label = "batch " + std::to_string(seed);
  batch.data = host->buffer->data();
  batch.size = host->buffer->size();
  batch.pinned = host->buffer->pinned();
  batch.tensors = host->tensors;
  batch.owner = std::move(host);
  return batch;
}

const HostSide& HostOf(const DeviceBatch& b) {
  return *static_cast<const HostSide*>(b.owner().get());
}

std::vector<TensorSpec> SmallSpecs() {
  return {{"cam0", DType::kUint8, {2, 3, 17, 19, 3}},
          {"state", DType::kFloat32, {2, 14}},
          {"state_is_pad", DType::kBool, {2, 1}},
          {"action", DType::kFloat32, {2, 50, 7}}};
}

// The bytes of `t`, wherever they live (copied back with cudaMemcpy when on the device).
std::vector<uint8_t> BytesOf(const DeviceBatch& b, const DeviceTensor& t) {
  std::vector<uint8_t> out(t.bytes);
  if (t.bytes == 0) return out;
  if (!b.on_device()) {
    std::memcpy(out.data(), t.data, t.bytes);
    return out;
  }
#if CONVEYOR_HAVE_CUDA
  const cudaError_t e = cudaMemcpy(out.data(), t.data, t.bytes, cudaMemcpyDeviceToHost);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
#else
  ADD_FAILURE() << "on_device() without CUDA in the build";
#endif
  return out;
}

// Checks names, dtypes, shapes, sizes and bytes of every tensor against the host batch.
void ExpectSameTensors(DeviceBatch& b) {
  ASSERT_TRUE(b.Wait().ok());
  const HostSide& host = HostOf(b);
  ASSERT_EQ(b.tensors().size(), host.tensors.size());
  for (size_t i = 0; i < host.tensors.size(); ++i) {
    const HostTensor& want = host.tensors[i];
    const DeviceTensor& got = b.tensors()[i];
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
    EXPECT_EQ(got.bytes, want.bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data) % 64, 0u) << got.name;
    const std::vector<uint8_t> bytes = BytesOf(b, got);
    EXPECT_EQ(0, std::memcmp(bytes.data(), host.data(want), want.bytes)) << got.name;
  }
}

std::unique_ptr<Uploader> MakeUploader(UploadOptions options) {
  absl::StatusOr<std::unique_ptr<Uploader>> u = Uploader::Create(options);
  EXPECT_TRUE(u.ok()) << u.status();
  return u.ok() ? *std::move(u) : nullptr;
}

bool MachineHasGpu() {
  static const bool gpu = [] {
    absl::StatusOr<std::unique_ptr<Uploader>> u = Uploader::Create({});
    return u.ok() && (*u)->gpu();
  }();
  return gpu;
}

std::string NoGpuReason() {
  absl::StatusOr<std::unique_ptr<Uploader>> u = Uploader::Create({});
  return u.ok() ? (*u)->cpu_reason() : std::string(u.status().message());
}

TEST(HostBufferTest, AlignedAndSized) {
  for (bool pinned : {false, true}) {
    for (size_t bytes :
         {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{3 * kMiB + 5}}) {
      std::shared_ptr<HostBuffer> b = HostBuffer::Allocate(bytes, pinned);
      ASSERT_NE(b, nullptr);
      ASSERT_NE(b->data(), nullptr) << bytes;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u) << bytes;
      EXPECT_EQ(b->size(), bytes);
      // Pinned exactly when asked for and a GPU is there to pin for.
      EXPECT_EQ(b->pinned(), pinned && MachineHasGpu()) << bytes;
      // The whole size is writable (and, under ASan, inside the allocation).
      std::memset(b->data(), 0x5A, bytes);
      if (bytes > 0) {
        EXPECT_EQ(b->data()[bytes - 1], 0x5A);
      }
    }
  }
}

TEST(UploadTest, CpuPathTensorsAreTheBatchBytes) {
  std::unique_ptr<Uploader> uploader = MakeUploader({.device = -1});
  ASSERT_NE(uploader, nullptr);
  EXPECT_FALSE(uploader->gpu());
  EXPECT_NE(uploader->cpu_reason(), "");
  HostBatch batch = MakeBatch(SmallSpecs(), 7);
  const uint8_t* host = batch.data;
  absl::StatusOr<std::unique_ptr<DeviceBatch>> b = uploader->Upload(std::move(batch));
  ASSERT_TRUE(b.ok()) << b.status();
  DeviceBatch& db = **b;
  EXPECT_FALSE(db.on_device());
  EXPECT_EQ(db.device(), -1);
  EXPECT_EQ(db.ready_event(), nullptr);
  EXPECT_TRUE(db.RecordUse(nullptr).ok());
  EXPECT_TRUE(db.WaitOnStream(nullptr).ok());
  EXPECT_EQ(db.label(), "batch 7");
  ExpectSameTensors(db);
  // No copy: the tensors point into the batch's own buffer.
  for (size_t i = 0; i < db.tensors().size(); ++i) {
    EXPECT_EQ(db.tensors()[i].data, host + HostOf(db).tensors[i].offset);
  }
  ASSERT_NE(db.Find("action"), nullptr);
  EXPECT_EQ(db.Find("action")->shape, (std::vector<int64_t>{2, 50, 7}));
  EXPECT_EQ(db.Find("nope"), nullptr);
  const Uploader::Stats stats = uploader->stats();
  EXPECT_EQ(stats.batches, 1u);
  EXPECT_EQ(stats.bytes, HostOf(db).tensors.back().offset + HostOf(db).tensors.back().bytes);
  EXPECT_EQ(stats.copy_seconds, 0);
}

// Whichever path the machine gives: the same tensors either way.
TEST(UploadTest, DefaultPathTensorsAreTheBatchBytes) {
  std::unique_ptr<Uploader> uploader = MakeUploader({});
  ASSERT_NE(uploader, nullptr);
  EXPECT_EQ(uploader->gpu(), uploader->cpu_reason().empty());
  absl::StatusOr<std::unique_ptr<DeviceBatch>> b = uploader->Upload(MakeBatch(SmallSpecs(), 8));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->on_device(), uploader->gpu());
  ExpectSameTensors(**b);
}

TEST(UploadTest, RequireGpu) {
  absl::StatusOr<std::unique_ptr<Uploader>> u = Uploader::Create({.require_gpu = true});
  if (MachineHasGpu()) {
    ASSERT_TRUE(u.ok()) << u.status();
    EXPECT_TRUE((*u)->gpu());
  } else {
    EXPECT_EQ(u.status().code(), absl::StatusCode::kFailedPrecondition) << u.status();
    EXPECT_NE(u.status().message().find("no usable GPU"), absl::string_view::npos) << u.status();
  }
}

#if CONVEYOR_HAVE_CUDA
// device/ loads the CUDA runtime with dlopen (device/internal/cudart.h): an absent library is an
// error naming it and where it was looked for, a library that is no CUDA runtime one naming the
// call it lacks. The real one loads wherever the toolkit the build found is still installed.
TEST(CudaRuntimeLoadTest, AbsentLibraryIsNamed) {
  absl::StatusOr<cuda::Runtime> r = cuda::OpenRuntime("libcudart.so.999", "/nonexistent/cuda");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(r.status().message());
  EXPECT_NE(m.find("the CUDA runtime libcudart.so.999 could not be loaded"), std::string::npos) << m;
  EXPECT_NE(m.find("/nonexistent/cuda/libcudart.so.999"), std::string::npos) << m;
}

TEST(CudaRuntimeLoadTest, ALibraryWithoutTheCallsIsNamed) {
  absl::StatusOr<cuda::Runtime> r = cuda::OpenRuntime("libz.so.1", "/nonexistent");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("libz.so.1 has no cudaGetErrorName"), absl::string_view::npos)
      << r.status();
}

TEST(CudaRuntimeLoadTest, TheBuildsRuntimeLoadsAndTheProbeUsesIt) {
  absl::StatusOr<const cuda::Runtime*> r = cuda::LoadRuntime();
  ASSERT_TRUE(r.ok()) << r.status();
  int count = -1;
  const cudaError_t e = (*r)->GetDeviceCount(&count);
  // Without a driver or a GPU the runtime says so; the probe reports the same.
  EXPECT_EQ(e == cudaSuccess && count > 0, MachineHasGpu()) << (*r)->GetErrorName(e);
}
#endif

TEST(UploadTest, BadOptionsAndBatches) {
  EXPECT_EQ(Uploader::Create({.buffers = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Uploader::Create({.device = -2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Uploader::Create({.device = -1, .require_gpu = true}).status().code(),
            absl::StatusCode::kInvalidArgument);
  if (MachineHasGpu()) {
    EXPECT_EQ(Uploader::Create({.device = 1000}).status().code(),
              absl::StatusCode::kInvalidArgument);
  }

  for (int device : {-1, 0}) {
    std::unique_ptr<Uploader> uploader = MakeUploader({.device = device, .buffers = 1});
    ASSERT_NE(uploader, nullptr);
    HostBatch no_block;
    EXPECT_EQ(uploader->Upload(std::move(no_block)).status().code(),
              absl::StatusCode::kInvalidArgument);
    HostBatch outside = MakeBatch(SmallSpecs(), 1);
    outside.tensors.back().bytes += 64 * 1024;
    absl::Status s = uploader->Upload(std::move(outside)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("action"), absl::string_view::npos) << s;
    // Failed uploads hold no buffer: with one buffer, this one would block otherwise.
    absl::StatusOr<std::unique_ptr<DeviceBatch>> ok = uploader->Upload(MakeBatch(SmallSpecs(), 2));
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(uploader->stats().batches, 1u);
  }
}

TEST(UploadTest, EmptyBatch) {
  for (int device : {-1, 0}) {
    std::unique_ptr<Uploader> uploader = MakeUploader({.device = device});
    ASSERT_NE(uploader, nullptr);
    std::shared_ptr<HostBuffer> buffer = HostBuffer::Allocate(0, true);
    HostBatch batch;
    batch.data = buffer->data();
    batch.size = buffer->size();
    batch.owner = buffer;
    batch.tensors.push_back(HostTensor{{.name = "empty", .shape = {0}}});
    absl::StatusOr<std::unique_ptr<DeviceBatch>> b = uploader->Upload(std::move(batch));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE((*b)->Wait().ok());
    EXPECT_EQ((*b)->tensors().at(0).bytes, 0u);
  }
}

// Batches one after another, the consumer holding at most `buffers` of them; every batch's bytes
// arrive intact although the buffers are reused (and grow: sizes vary).
TEST(UploadTest, ManyBatchesInARow) {
  for (int device : {-1, 0}) {
    for (int buffers : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << "device " << device << ", buffers " << buffers);
      std::unique_ptr<Uploader> uploader = MakeUploader({.device = device, .buffers = buffers});
      ASSERT_NE(uploader, nullptr);
      std::deque<std::unique_ptr<DeviceBatch>> live;
      uint64_t bytes = 0;
      for (uint64_t i = 0; i < 24; ++i) {
        if (live.size() == static_cast<size_t>(buffers)) {
          ExpectSameTensors(*live.front());
          live.pop_front();
        }
        const int64_t frames = 1 + static_cast<int64_t>(i % 5);
        HostBatch batch = MakeBatch(
            {{"cam", DType::kUint8, {frames, 64, 64, 3}}, {"action", DType::kFloat32, {frames, 7}}},
            100 + i);
        bytes += batch.tensors.back().offset + batch.tensors.back().bytes;
        absl::StatusOr<std::unique_ptr<DeviceBatch>> b = uploader->Upload(std::move(batch));
        ASSERT_TRUE(b.ok()) << b.status();
        EXPECT_EQ(HostOf(**b).seed, 100 + i);
        live.push_back(*std::move(b));
      }
      while (!live.empty()) {
        ExpectSameTensors(*live.front());
        live.pop_front();
      }
      const Uploader::Stats stats = uploader->stats();
      EXPECT_EQ(stats.batches, 24u);
      EXPECT_EQ(stats.bytes, bytes);
      EXPECT_EQ(stats.pageable_batches, 0u);
      EXPECT_EQ(stats.copy_seconds > 0, uploader->gpu());
    }
  }
}

// With every buffer held by a live DeviceBatch, Upload blocks; releasing one lets it go on.
TEST(UploadTest, UploadBlocksWhileAllBuffersAreInUse) {
  for (int device : {-1, 0}) {
    SCOPED_TRACE(testing::Message() << "device " << device);
    std::unique_ptr<Uploader> uploader = MakeUploader({.device = device, .buffers = 2});
    ASSERT_NE(uploader, nullptr);
    absl::StatusOr<std::unique_ptr<DeviceBatch>> first =
        uploader->Upload(MakeBatch(SmallSpecs(), 1));
    absl::StatusOr<std::unique_ptr<DeviceBatch>> second =
        uploader->Upload(MakeBatch(SmallSpecs(), 2));
    ASSERT_TRUE(first.ok() && second.ok());

    std::atomic<bool> done{false};
    absl::StatusOr<std::unique_ptr<DeviceBatch>> third;
    std::thread producer([&] {
      third = uploader->Upload(MakeBatch(SmallSpecs(), 3));
      done = true;
    });
    // Not a timing assertion: if Upload wrongly returned, it would almost surely have by now.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(done.load());
    ExpectSameTensors(**second);
    second->reset();  // gives a buffer back
    producer.join();
    EXPECT_TRUE(done.load());
    ASSERT_TRUE(third.ok()) << third.status();
    ExpectSameTensors(**third);
    ExpectSameTensors(**first);
    EXPECT_GT(uploader->stats().wait_seconds, 0);
  }
}

// A producer thread uploads while a consumer thread checks and drops batches at its own pace; at
// no time are more than `buffers` DeviceBatches alive.
TEST(UploadTest, ProducerAndConsumerThreads) {
  for (int device : {-1, 0}) {
    SCOPED_TRACE(testing::Message() << "device " << device);
    constexpr int kBuffers = 2;
    constexpr uint64_t kBatches = 60;
    std::unique_ptr<Uploader> uploader = MakeUploader({.device = device, .buffers = kBuffers});
    ASSERT_NE(uploader, nullptr);
    std::mutex mu;
    std::queue<std::unique_ptr<DeviceBatch>> queue;  // unbounded: only the uploader bounds it
    std::atomic<int> alive{0};
    std::atomic<int> max_alive{0};
    std::atomic<bool> failed{false};
    std::thread producer([&] {
      for (uint64_t i = 0; i < kBatches; ++i) {
        absl::StatusOr<std::unique_ptr<DeviceBatch>> b =
            uploader->Upload(MakeBatch(SmallSpecs(), 1000 + i));
        if (!b.ok()) failed = true;
        ASSERT_TRUE(b.ok()) << b.status();
        // Counted after Upload returned and before the destructor runs: never above the truth.
        const int now = ++alive;
        int seen = max_alive.load();
        while (now > seen && !max_alive.compare_exchange_weak(seen, now)) {
        }
        std::lock_guard<std::mutex> lock(mu);
        queue.push(*std::move(b));
      }
    });
    std::mt19937 rng(3);
    for (uint64_t i = 0; i < kBatches && !failed;) {
      std::unique_ptr<DeviceBatch> b;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!queue.empty()) {
          b = std::move(queue.front());
          queue.pop();
        }
      }
      if (b == nullptr) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      EXPECT_EQ(HostOf(*b).seed, 1000 + i);  // in order
      ExpectSameTensors(*b);
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      --alive;
      b.reset();
      ++i;
    }
    producer.join();
    EXPECT_LE(max_alive.load(), kBuffers);
    EXPECT_GE(max_alive.load(), 1);
    EXPECT_EQ(uploader->stats().batches, kBatches);
  }
}

// free_buffers() says when the next Upload would block; Cancel() releases an Upload blocked for a
// buffer (CANCELLED) and refuses later ones, while live batches stay valid.
TEST(UploadTest, CancelReleasesABlockedUpload) {
  for (int device : {-1, 0}) {
    SCOPED_TRACE(testing::Message() << "device " << device);
    std::unique_ptr<Uploader> uploader = MakeUploader({.device = device, .buffers = 1});
    ASSERT_NE(uploader, nullptr);
    EXPECT_EQ(uploader->free_buffers(), 1);
    absl::StatusOr<std::unique_ptr<DeviceBatch>> held =
        uploader->Upload(MakeBatch(SmallSpecs(), 1));
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(uploader->free_buffers(), 0);

    std::atomic<bool> done{false};
    absl::StatusOr<std::unique_ptr<DeviceBatch>> blocked;
    std::thread producer([&] {
      blocked = uploader->Upload(MakeBatch(SmallSpecs(), 2));
      done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(done.load());
    uploader->Cancel();
    producer.join();
    EXPECT_EQ(blocked.status().code(), absl::StatusCode::kCancelled) << blocked.status();
    ExpectSameTensors(**held);
    held->reset();
    EXPECT_EQ(uploader->free_buffers(), 1);
    EXPECT_EQ(uploader->Upload(MakeBatch(SmallSpecs(), 3)).status().code(),
              absl::StatusCode::kCancelled);
    EXPECT_EQ(uploader->device(), uploader->gpu() ? 0 : -1);
  }
}

// DeviceBatches keep the uploader's buffers (and stream) alive after the Uploader is gone.
TEST(UploadTest, BatchOutlivesUploader) {
  for (int device : {-1, 0}) {
    std::unique_ptr<Uploader> uploader = MakeUploader({.device = device});
    ASSERT_NE(uploader, nullptr);
    absl::StatusOr<std::unique_ptr<DeviceBatch>> b = uploader->Upload(MakeBatch(SmallSpecs(), 5));
    ASSERT_TRUE(b.ok()) << b.status();
    uploader.reset();
    ExpectSameTensors(**b);
  }
}

TEST(GpuUploadTest, CopyBackMatches) {
  if (!MachineHasGpu()) GTEST_SKIP() << "no usable GPU: " << NoGpuReason();
#if CONVEYOR_HAVE_CUDA
  std::unique_ptr<Uploader> uploader = MakeUploader({.require_gpu = true});
  ASSERT_NE(uploader, nullptr);
  // Larger than the 1 MiB growth step, and not a multiple of it.
  HostBatch batch = MakeBatch(
      {{"cam", DType::kUint8, {4, 3, 224, 224, 3}}, {"state", DType::kFloat32, {4, 14}}}, 42);
  absl::StatusOr<std::unique_ptr<DeviceBatch>> b = uploader->Upload(std::move(batch));
  ASSERT_TRUE(b.ok()) << b.status();
  DeviceBatch& db = **b;
  EXPECT_TRUE(db.on_device());
  EXPECT_EQ(db.device(), 0);
  EXPECT_NE(db.ready_event(), nullptr);
  ASSERT_TRUE(db.Wait().ok());
  for (const DeviceTensor& t : db.tensors()) {
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, t.data), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeDevice) << t.name;
    EXPECT_EQ(attributes.device, 0) << t.name;
  }
  ExpectSameTensors(db);
  EXPECT_TRUE(HostOf(db).buffer->pinned());
  EXPECT_GT(uploader->stats().copy_seconds, 0);
#endif
}

// A consumer orders its own stream after the copy with WaitOnStream (no host wait), declares it
// with RecordUse and drops the batch without synchronizing; the next copy into that buffer must
// wait for the consumer's work on the GPU, and the consumer's read for the copy. The
// consumer's stream is made slow on purpose (a host function that sleeps before each read), so a
// copy that did not wait would overwrite the tensor before the consumer has read it.
TEST(GpuUploadTest, RecordUseOrdersTheNextCopy) {
  if (!MachineHasGpu()) GTEST_SKIP() << "no usable GPU: " << NoGpuReason();
#if CONVEYOR_HAVE_CUDA
  std::unique_ptr<Uploader> uploader = MakeUploader({.buffers = 1, .require_gpu = true});
  ASSERT_NE(uploader, nullptr);
  absl::StatusOr<cuda::UniqueStream> stream = cuda::MakeStream(cudaStreamNonBlocking);
  ASSERT_TRUE(stream.ok()) << stream.status();
  constexpr int kBatches = 4;
  const std::vector<TensorSpec> specs = {{"x", DType::kUint8, {8 * 1024 * 1024}}};
  std::vector<cuda::UniquePinnedMemory> seen;
  for (int i = 0; i < kBatches; ++i) {
    absl::StatusOr<cuda::UniquePinnedMemory> m = cuda::AllocPinned(8 * kMiB);
    ASSERT_TRUE(m.ok()) << m.status();
    seen.push_back(*std::move(m));
  }
  for (int i = 0; i < kBatches; ++i) {
    absl::StatusOr<std::unique_ptr<DeviceBatch>> b = uploader->Upload(MakeBatch(specs, 200 + i));
    ASSERT_TRUE(b.ok()) << b.status();
    const DeviceTensor& x = (*b)->tensors()[0];
    ASSERT_TRUE((*b)->WaitOnStream(stream->get()).ok());
    ASSERT_EQ(
        cudaLaunchHostFunc(
            stream->get(),
            [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr),
        cudaSuccess);
    ASSERT_EQ(
        cudaMemcpyAsync(seen[i].get(), x.data, x.bytes, cudaMemcpyDeviceToHost, stream->get()),
        cudaSuccess);
    ASSERT_TRUE((*b)->RecordUse(stream->get()).ok());
    b->reset();  // gives the only buffer back while the consumer's read is still queued
  }
  ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
  for (int i = 0; i < kBatches; ++i) {
    const std::shared_ptr<HostSide> expected = MakeHost(specs, 200 + i, /*pinned=*/false);
    EXPECT_EQ(0, std::memcmp(seen[i].get(), expected->buffer->data(), 8 * kMiB)) << "batch " << i;
  }
#endif
}

TEST(GpuUploadTest, PageableBufferIsCopiedAndCounted) {
  if (!MachineHasGpu()) GTEST_SKIP() << "no usable GPU: " << NoGpuReason();
  std::unique_ptr<Uploader> uploader = MakeUploader({.require_gpu = true});
  ASSERT_NE(uploader, nullptr);
  absl::StatusOr<std::unique_ptr<DeviceBatch>> b =
      uploader->Upload(MakeBatch(SmallSpecs(), 9, /*pinned=*/false));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(HostOf(**b).buffer->pinned());
  ExpectSameTensors(**b);
  EXPECT_EQ(uploader->stats().pageable_batches, 1u);
}

}  // namespace
}  // namespace conveyor
