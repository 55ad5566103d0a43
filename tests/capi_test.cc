// The C ABI (capi/include/conveyor/conveyor_c.h) as another language calls it: through the shared
// library only (this test links libconveyor_c.so and nothing of the client; linking both would
// register the wire protocol's descriptors twice). Against a real `conveyor serve`: batches equal
// `conveyor batches --digest --ids`, metadata, cursor and stats, the end of the stream, DLPack
// exports that outlive their handle, a cancel from another thread, launch variables, and errors
// that name the option or the cause; the cursor parser and the option defaults bindings take from
// the library instead of restating them.
#include "conveyor/conveyor_c.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"  // ClientOptions' in-class defaults only: nothing of it is linked
#include "nlohmann/json.hpp"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using json = nlohmann::json;
using testing::ServerProcess;
using testing::TempDir;

const std::string kCli = CONVEYOR_CLI;
const std::string kConfig = std::string(CONVEYOR_SOURCE_DIR) + "/examples/pipeline.yaml";

std::string TakeString(char* s) {
  std::string out = s == nullptr ? "" : s;
  conveyor_string_free(s);
  return out;
}

const char* DTypeName(int32_t t) {
  switch (t) {
    case CONVEYOR_UINT8: return "uint8";
    case CONVEYOR_BOOL: return "bool";
    case CONVEYOR_FLOAT32: return "float32";
    case CONVEYOR_INT32: return "int32";
    case CONVEYOR_FLOAT16: return "float16";
    case CONVEYOR_BFLOAT16: return "bfloat16";
  }
  return "?";
}

// The `sha256` and `[ids]` fields of tools/batch_line.cc's line, from a batch handle.
std::string Line(const conveyor_batch* b) {
  conveyor_batch_info info{};
  info.size = sizeof(info);
  EXPECT_EQ(conveyor_batch_info_get(b, &info), CONVEYOR_OK);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  for (uint32_t i = 0; i < info.tensors; ++i) {
    conveyor_tensor t{};
    t.size = sizeof(t);
    EXPECT_EQ(conveyor_batch_tensor(b, i, &t), CONVEYOR_OK);
    std::string head = std::string(t.name) + "|" + DTypeName(t.dtype) + "|";
    for (int32_t d = 0; d < t.ndim; ++d) head += std::to_string(t.shape[d]) + ",";
    EVP_DigestUpdate(ctx.get(), head.data(), head.size());
    EVP_DigestUpdate(ctx.get(), t.data, t.bytes);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string line = std::to_string(info.epoch) + ":" + std::to_string(info.step) + " sha256 ";
  static const char* kHex = "0123456789abcdef";
  for (unsigned i = 0; i < len; ++i) line += {kHex[md[i] >> 4], kHex[md[i] & 15]};
  std::vector<int64_t> ids(3 * info.samples);
  std::vector<int32_t> datasets(info.samples);
  EXPECT_EQ(conveyor_batch_ids(b, ids.data(), datasets.data()), CONVEYOR_OK);
  line += " [";
  for (uint64_t k = 0; k < info.samples; ++k) {
    if (k) line += " ";
    if (datasets[k] != 0) line += std::to_string(datasets[k]) + ":";
    line += std::to_string(ids[3 * k + 1]) + "/" + std::to_string(ids[3 * k + 2]);
  }
  return line + "]";
}

// The same fields from `conveyor batches --digest --ids` (or fetch) output.
std::vector<std::string> CliLines(const std::string& output) {
  std::vector<std::string> out;
  for (const std::string& l : testing::SplitLines(output)) {
    const size_t sha = l.find(" sha256 ");
    if (sha == std::string::npos) continue;
    out.push_back(l.substr(0, l.find(' ')) + l.substr(sha));
  }
  return out;
}

class CapiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_SH(kCli + " synth --out " + dir_->Join("ds") + " --episodes 2 --episode-seconds 3 --quiet");
    server_ = new ServerProcess(kCli, {dir_->Join("ds"), "--config", kConfig}, dir_->path());
    ASSERT_TRUE(server_->ok()) << server_->log();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }

  static conveyor_client* Client(json options) {
    options["servers"] = {server_->address()};
    conveyor_client* c = nullptr;
    EXPECT_EQ(conveyor_client_create(options.dump().c_str(), &c), CONVEYOR_OK)
        << conveyor_last_error();
    return c;
  }

  static TempDir* dir_;
  static ServerProcess* server_;
};
TempDir* CapiTest::dir_ = nullptr;
ServerProcess* CapiTest::server_ = nullptr;

TEST(CapiLibraryTest, VersionsAndDevice) {
  EXPECT_EQ(conveyor_abi_version(), CONVEYOR_C_ABI_VERSION);
  EXPECT_GT(std::strlen(conveyor_version()), 0u);
  EXPECT_GE(conveyor_protocol_version(), 1u);
  if (!conveyor_device_supported()) {
    EXPECT_EQ(conveyor_check_device(0), CONVEYOR_FAILED_PRECONDITION);
    EXPECT_NE(std::string(conveyor_last_error()).find("cuda:0"), std::string::npos)
        << conveyor_last_error();
    conveyor_client* c = nullptr;
    EXPECT_EQ(conveyor_client_create(R"({"servers": ["127.0.0.1:1"], "device": 0})", &c),
              CONVEYOR_FAILED_PRECONDITION);
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(std::string(conveyor_last_error()).find("no usable GPU"), std::string::npos)
        << conveyor_last_error();
  }
}

TEST(CapiLibraryTest, BadOptionsNameTheOption) {
  struct Case {
    const char* options;
    const char* says;
  } cases[] = {
      {"{not json", "client options: not JSON"},
      {"[1, 2]", "client options: not an object"},
      {R"({"servers": ["a:1"], "prefetch_batchez": 4})", "unknown option 'prefetch_batchez'"},
      {R"({"servers": ["a:1"], "consumer": -1})", "option 'consumer': -1 is not a non-negative integer"},
      {R"({"servers": ["a:1"], "shared_memory": "yes"})", "option 'shared_memory': \"yes\" is not a boolean"},
      {R"({"servers": ["a:1"], "start": [1]})", "option 'start': expected [epoch, step]"},
      {R"({"servers": 7})", "option 'servers': expected a list"},
  };
  for (const Case& k : cases) {
    conveyor_client* c = nullptr;
    EXPECT_EQ(conveyor_client_create(k.options, &c), CONVEYOR_INVALID_ARGUMENT) << k.options;
    EXPECT_EQ(c, nullptr);
    const std::string error = conveyor_last_error();
    EXPECT_EQ(error.rfind("INVALID_ARGUMENT: ", 0), 0u) << error;
    EXPECT_NE(error.find(k.says), std::string::npos) << error;
  }
}

TEST(CapiLibraryTest, ResolveLaunchReadsTheLauncher) {
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "4", 1);
  char* out = nullptr;
  ASSERT_EQ(conveyor_resolve_launch(R"({"servers": "h:1,h:2"})", &out), CONVEYOR_OK)
      << conveyor_last_error();
  const json r = json::parse(TakeString(out));
  EXPECT_EQ(r["rank"], 2);
  EXPECT_EQ(r["world_size"], 4);
  EXPECT_EQ(r["servers"], json({"h:1", "h:2"}));
  EXPECT_EQ(r["source"], "RANK, WORLD_SIZE");
  setenv("RANK", "4", 1);  // not below the world size
  EXPECT_EQ(conveyor_resolve_launch(R"({"servers": "h:1"})", &out), CONVEYOR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(conveyor_last_error()).find("RANK"), std::string::npos)
      << conveyor_last_error();
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
}

TEST(CapiLibraryTest, ParseCursorIsTheClientsParser) {
  uint64_t epoch = 9, step = 9, position = 9;
  ASSERT_EQ(conveyor_parse_cursor("3:7", &epoch, &step, &position), CONVEYOR_OK);
  EXPECT_EQ(epoch, 3u);
  EXPECT_EQ(step, 7u);
  EXPECT_EQ(position, CONVEYOR_NO_POSITION);
  ASSERT_EQ(conveyor_parse_cursor("2@640", &epoch, &step, &position), CONVEYOR_OK);
  EXPECT_EQ(epoch, 2u);
  EXPECT_EQ(step, 0u);
  EXPECT_EQ(position, 640u);
  ASSERT_EQ(conveyor_parse_cursor("0:9999999999999999999", &epoch, &step, &position), CONVEYOR_OK);
  EXPECT_EQ(step, 9999999999999999999ull);
  // What Cursor::Parse refuses: a sign, spaces, a third part, 20 digits, no separator.
  for (const char* bad : {"3", "-1:0", "1:-2", " 1:2", "1:2 ", "1:2:3", "1@2@3", "a:1", "1:",
                          "0:10000000000000000000", ""}) {
    epoch = step = position = 5;
    EXPECT_EQ(conveyor_parse_cursor(bad, &epoch, &step, &position), CONVEYOR_INVALID_ARGUMENT)
        << bad;
    const std::string error = conveyor_last_error();
    EXPECT_NE(error.find(std::string("cursor '") + bad + "'"), std::string::npos) << error;
    EXPECT_EQ(epoch + step + position, 15u) << bad << ": written on failure";
  }
  EXPECT_EQ(conveyor_parse_cursor(nullptr, &epoch, &step, &position), CONVEYOR_INVALID_ARGUMENT);
}

TEST(CapiLibraryTest, ClientDefaultsAreTheClientOptions) {
  char* out = nullptr;
  ASSERT_EQ(conveyor_client_defaults(&out), CONVEYOR_OK) << conveyor_last_error();
  const json d = json::parse(TakeString(out));
  const client::ClientOptions o;
  EXPECT_EQ(d["job"], o.job);
  EXPECT_EQ(d["consumer"], o.consumer);
  EXPECT_EQ(d["consumers"], o.consumers);
  EXPECT_EQ(d["start"], o.start.ToString());
  EXPECT_EQ(d["max_batches"], o.max_batches);
  EXPECT_EQ(d["prefetch_batches"], o.prefetch_batches);
  EXPECT_EQ(d["prefetch_bytes"], o.prefetch_bytes);
  EXPECT_EQ(d["max_batch_bytes"], o.max_batch_bytes);
  EXPECT_EQ(d["reconnect_timeout_s"], o.reconnect_timeout_s);
  EXPECT_EQ(d["report_interval_s"], o.report_interval_s);
  EXPECT_EQ(d["shared_memory"], o.shared_memory);
  EXPECT_EQ(d["shared_memory_bytes"], o.shared_memory_bytes);
  EXPECT_EQ(d["payload_streams"], o.payload_streams);
  EXPECT_EQ(d["pin_from_environment"], o.pin_from_environment);
  EXPECT_EQ(d["device"], -1);
  // Every name is one conveyor_client_create takes: a misspelt one would be an unknown option.
  json options = d;
  options["servers"] = {"127.0.0.1:1"};
  conveyor_client* c = nullptr;
  ASSERT_EQ(conveyor_client_create(options.dump().c_str(), &c), CONVEYOR_OK)
      << conveyor_last_error();
  conveyor_client_destroy(c);
}

TEST_F(CapiTest, BatchesEqualTheCli) {
  const testing::CommandResult cli = testing::RunCommand(
      kCli + " batches " + dir_->Join("ds") + " --config " + kConfig +
      " --steps 6 --consumer 1 --consumers 2 --cursor 0:1 --digest --ids");
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  const std::vector<std::string> want = CliLines(cli.output);
  ASSERT_EQ(want.size(), 6u) << cli.output;
  for (bool shm : {true, false}) {
    conveyor_client* c = Client({{"consumer", 1}, {"consumers", 2}, {"start", {0, 1}},
                                 {"max_batches", 6}, {"shared_memory", shm}});
    ASSERT_NE(c, nullptr);
    std::vector<std::string> got;
    std::set<uint64_t> layouts;
    for (;;) {
      conveyor_batch* b = nullptr;
      ASSERT_EQ(conveyor_client_next(c, -1, &b), CONVEYOR_OK) << conveyor_last_error();
      if (b == nullptr) break;  // the end of the stream: OK and no batch
      conveyor_batch_info info{};
      info.size = sizeof(info);
      ASSERT_EQ(conveyor_batch_info_get(b, &info), CONVEYOR_OK);
      EXPECT_EQ(info.consumer, 1u);
      EXPECT_EQ(info.consumers, 2u);
      EXPECT_EQ(info.device, -1);
      EXPECT_EQ(info.next_step, info.step + 1);
      EXPECT_EQ(std::string(info.server), server_->address());
      // Every tensor lies inside the payload span, 64-byte aligned, with its role.
      bool saw_padding = false;
      for (uint32_t i = 0; i < info.tensors; ++i) {
        conveyor_tensor t{};
        t.size = sizeof(t);
        ASSERT_EQ(conveyor_batch_tensor(b, i, &t), CONVEYOR_OK);
        const auto* p = static_cast<const uint8_t*>(t.data);
        const auto* lo = static_cast<const uint8_t*>(info.payload);
        EXPECT_GE(p, lo) << t.name;
        EXPECT_LE(p + t.bytes, lo + info.payload_bytes) << t.name;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << t.name;
        EXPECT_EQ(t.device_data, nullptr);
        if (std::string(t.name).ends_with("_is_pad")) {
          EXPECT_EQ(t.role, CONVEYOR_ROLE_PADDING_MASK) << t.name;
          saw_padding = true;
        }
      }
      EXPECT_TRUE(saw_padding);
      conveyor_tensor past{};
      past.size = sizeof(past);
      EXPECT_EQ(conveyor_batch_tensor(b, info.tensors, &past), CONVEYOR_OUT_OF_RANGE);
      got.push_back(Line(b));
      layouts.insert(conveyor_batch_layout(b));
      conveyor_batch_free(b);
    }
    EXPECT_EQ(got, want) << "shared_memory " << shm;
    EXPECT_EQ(layouts.size(), 1u) << "a stream's batches share one layout";
    uint64_t epoch = 9, step = 9;
    conveyor_client_cursor(c, &epoch, &step);
    EXPECT_EQ(epoch, 0u);
    EXPECT_EQ(step, 7u);
    EXPECT_GE(conveyor_client_schedule_version(c), 1u);
    char* stats = nullptr;
    ASSERT_EQ(conveyor_client_stats(c, &stats), CONVEYOR_OK);
    const json s = json::parse(TakeString(stats));
    EXPECT_EQ(s["batches"], 6);
    EXPECT_EQ(s["transport"], shm ? "shared_memory" : "grpc");
    conveyor_client_destroy(c);
  }
}

TEST_F(CapiTest, DlpackExportsOutliveTheHandle) {
  conveyor_client* c = Client({{"max_batches", 4}});
  ASSERT_NE(c, nullptr);
  conveyor_batch* b = nullptr;
  ASSERT_EQ(conveyor_client_next(c, -1, &b), CONVEYOR_OK) << conveyor_last_error();
  ASSERT_NE(b, nullptr);
  conveyor_tensor t{};
  t.size = sizeof(t);
  ASSERT_EQ(conveyor_batch_tensor(b, 0, &t), CONVEYOR_OK);
  const std::vector<uint8_t> want(static_cast<const uint8_t*>(t.data),
                                  static_cast<const uint8_t*>(t.data) + t.bytes);
  conveyor_dl_managed_tensor* m = nullptr;
  ASSERT_EQ(conveyor_batch_dlpack(b, 0, /*on_device=*/0, /*as_uint8=*/0, &m), CONVEYOR_OK);
  EXPECT_EQ(m->dl_tensor.data, t.data);
  EXPECT_EQ(m->dl_tensor.device.device_type, 1);
  EXPECT_EQ(m->dl_tensor.ndim, t.ndim);
  EXPECT_EQ(m->dl_tensor.strides, nullptr);
  // No device copy without device delivery.
  conveyor_dl_managed_tensor* none = nullptr;
  EXPECT_EQ(conveyor_batch_dlpack(b, 0, /*on_device=*/1, 0, &none), CONVEYOR_FAILED_PRECONDITION);
  EXPECT_EQ(conveyor_batch_wait_on_stream(b, nullptr), CONVEYOR_OK);  // nothing to wait for
  conveyor_batch_free(b);
  // The client moves on and reuses blocks that were released; the export still holds its own.
  for (int i = 0; i < 3; ++i) {
    conveyor_batch* next = nullptr;
    ASSERT_EQ(conveyor_client_next(c, -1, &next), CONVEYOR_OK) << conveyor_last_error();
    ASSERT_NE(next, nullptr);
    conveyor_batch_free(next);
  }
  conveyor_client_destroy(c);
  EXPECT_EQ(0, std::memcmp(m->dl_tensor.data, want.data(), want.size()));
  m->deleter(m);
}

TEST_F(CapiTest, CancelFromAnotherThreadWakesNext) {
  // A server that never answers: next waits until the cancel.
  conveyor_client* c = nullptr;
  ASSERT_EQ(conveyor_client_create(
                R"({"servers": ["127.0.0.1:1"], "reconnect_timeout_s": 30})", &c),
            CONVEYOR_OK);
  std::thread canceller([c] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    conveyor_client_cancel(c);
  });
  const auto t0 = std::chrono::steady_clock::now();
  conveyor_batch* b = nullptr;
  EXPECT_EQ(conveyor_client_next(c, -1, &b), CONVEYOR_CANCELLED) << conveyor_last_error();
  canceller.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // A timed wait on a cancelled client is final too, not a time-out.
  EXPECT_EQ(conveyor_client_next(c, 0.05, &b), CONVEYOR_CANCELLED);
  conveyor_client_destroy(c);
}

TEST_F(CapiTest, InfoAndServerErrors) {
  char* out = nullptr;
  const json req = {{"servers", {server_->address()}}};
  ASSERT_EQ(conveyor_get_info(req.dump().c_str(), &out), CONVEYOR_OK) << conveyor_last_error();
  const json info = json::parse(TakeString(out));
  EXPECT_EQ(info["configs"][0]["name"], "pipeline");
  // 64-bit fields are numbers, at the top and nested (not the proto3 JSON mapping's strings).
  EXPECT_TRUE(info["episodes"].is_number_unsigned()) << info["episodes"];
  EXPECT_EQ(info["episodes"], 2);
  EXPECT_TRUE(info["max_message_bytes"].is_number_unsigned()) << info["max_message_bytes"];
  EXPECT_TRUE(info["configs"][0]["global_batch_size"].is_number_unsigned())
      << info["configs"][0];
  size_t dims = 0;  // repeated int64: each element a number
  for (const json& stream : info["streams"]) {
    for (const json& d : stream["shape"]) {
      EXPECT_TRUE(d.is_number_integer()) << stream;
      ++dims;
    }
  }
  EXPECT_GT(dims, 0u) << info["streams"];
  // A config the server refuses: its message, naming the key, through next().
  conveyor_client* c =
      Client({{"config_yaml", testing::ReadFile(kConfig) + "\nbogus_key: 1\n"}});
  ASSERT_NE(c, nullptr);
  conveyor_batch* b = nullptr;
  EXPECT_EQ(conveyor_client_next(c, -1, &b), CONVEYOR_INVALID_ARGUMENT);
  EXPECT_EQ(b, nullptr);
  const std::string error = conveyor_last_error();
  EXPECT_NE(error.find("server " + server_->address()), std::string::npos) << error;
  EXPECT_NE(error.find("bogus_key"), std::string::npos) << error;
  conveyor_client_destroy(c);
}

}  // namespace
}  // namespace conveyor
