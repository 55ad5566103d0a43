// The S3 backend against a real S3 service that checks SigV4: Ceph's radosgw on 127.0.0.1 over
// one monitor and one memstore OSD (tests/s3/radosgw.sh, about 13 s to start), with a synthetic
// dataset uploaded by the aws CLI. The CLI reads it with the AWS_* variables a user would set.
//
// One process for the whole suite (the gateway starts once), registered as one ctest test with
// the label "s3"; it exits 77 (skipped) with the reason when radosgw or /usr/bin/aws is missing
// or the gateway does not come up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "storage/storage.h"
#include "tests/support/fault_proxy.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::FaultAction;
using testing::FaultProxy;
using testing::RunCommand;
using testing::ShellCommand;
using testing::ShellQuote;
using testing::TempDir;

const std::string kCli = CONVEYOR_CLI;
const std::string kScript = std::string(CONVEYOR_SOURCE_DIR) + "/tests/s3/radosgw.sh";
const std::string kAws = "/usr/bin/aws";  // Debian's awscli: not a pyenv shim earlier on PATH
constexpr char kBucket[] = "conveyor-test";

constexpr char kConfig[] = R"(anchor: action
streams:
  cam0:
    delta_timestamps: [0.0]
    size: [64, 64]
  observation.state:
    delta_timestamps: [0.0]
  action:
    delta_timestamps: {start: 0.0, step: 0.02, count: 50}
pipeline:
  global_batch_size: 16
  seed: 7
  schedule: {mode: gop}
)";

// The gateway and the dataset, shared by every test of the process.
struct Gateway {
  std::unique_ptr<TempDir> dir;
  int port = 0;
  std::string access_key;
  std::string secret_key;
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port); }
  std::string local_ds() const { return dir->Join("ds"); }
  std::string config() const { return dir->Join("config.yaml"); }
  std::string s3_ds() const { return std::string("s3://") + kBucket + "/ds"; }
  std::string lerobot_local() const { return std::string(CONVEYOR_LEROBOT_FIXTURE_DIR) + "/v30"; }
  std::string lerobot_skip;  // why the LeRobot fixture is not there, if it is not
  std::string rlds_skip;     // the same for the RLDS fixture
};
Gateway* gateway = nullptr;

// "VAR=value ..." for a command line: the environment a user would export.
std::string Env(const std::map<std::string, std::string>& vars) {
  std::string out = "env -u AWS_PROFILE -u AWS_SESSION_TOKEN -u AWS_NO_SIGN_REQUEST -u CONVEYOR_CACHE_DIR";
  for (const auto& [k, v] : vars) out += " " + k + "=" + ShellQuote(v);
  return out + " ";
}

std::map<std::string, std::string> UserEnv(const std::string& endpoint = "") {
  return {{"AWS_ACCESS_KEY_ID", gateway->access_key},
          {"AWS_SECRET_ACCESS_KEY", gateway->secret_key},
          {"AWS_REGION", "us-east-1"},
          {"AWS_ENDPOINT_URL", endpoint.empty() ? gateway->endpoint() : endpoint},
          {"HOME", gateway->dir->path()}};  // no ~/.aws of the machine's
}

testing::CommandResult Cli(const std::map<std::string, std::string>& env,
                           const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kCli};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(Env(env) + ShellCommand(argv), 300);
}

std::vector<std::string> Digests(const std::map<std::string, std::string>& env,
                                 const std::string& dataset, const std::string& extra = "",
                                 const std::string& config = "") {
  auto r = RunCommand(Env(env) + ShellCommand({kCli, "batches", dataset, "--config",
                                               config.empty() ? gateway->config() : config,
                                               "--steps", "6", "--digest"}) +
                      " " + extra + " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return testing::SplitLines(r.output);
}

// The batch lines of `conveyor batches --stats` output (the stats lines dropped).
std::vector<std::string> BatchLines(const std::string& output) {
  std::vector<std::string> lines;
  for (const std::string& l : testing::SplitLines(output)) {
    if (!absl::StartsWith(l, "stats:") && !absl::StartsWith(l, "  ")) lines.push_back(l);
  }
  return lines;
}

// Sets AWS_* in this process for library-level tests (restored by the next call's values).
void SetProcessEnv(const std::map<std::string, std::string>& vars) {
  for (const char* v : {"AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_NO_SIGN_REQUEST",
                        "CONVEYOR_CACHE_DIR", "AWS_ENDPOINT_URL_S3"}) {
    unsetenv(v);
  }
  for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
}

TEST(S3Radosgw, InspectVerifyWithTheUsualEnvironment) {
  auto r = Cli(UserEnv(), {"inspect", "--verify", gateway->s3_ds()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, gateway->secret_key));
}

TEST(S3Radosgw, BatchDigestsEqualTheLocalCopys) {
  const std::vector<std::string> local = Digests({}, gateway->local_ds());
  ASSERT_EQ(local.size(), 6u);
  EXPECT_EQ(Digests(UserEnv(), gateway->s3_ds()), local);
  // The endpoint as a flag instead of AWS_ENDPOINT_URL, before or after the subcommand.
  auto env = UserEnv();
  env.erase("AWS_ENDPOINT_URL");
  for (const std::string where : {"before", "after"}) {
    std::vector<std::string> args = {"batches", gateway->s3_ds(), "--config", gateway->config(),
                                     "--steps", "6", "--digest"};
    if (where == "before") {
      args.insert(args.begin(), {"--s3-endpoint", gateway->endpoint()});
    } else {
      args.insert(args.end(), {"--s3-endpoint", gateway->endpoint()});
    }
    std::vector<std::string> argv = {kCli};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = RunCommand(Env(env) + "env -u AWS_ENDPOINT_URL " + ShellCommand(argv) + " 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << where << ": " << r.output;
    EXPECT_EQ(testing::SplitLines(r.output), local) << where;
  }
}

TEST(S3Radosgw, AWrongSecretSaysSignatureDoesNotMatchAndWhatToCheck) {
  auto env = UserEnv();
  env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret-0123456789";
  auto r = Cli(env, {"inspect", gateway->s3_ds()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "SignatureDoesNotMatch")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "AWS_SECRET_ACCESS_KEY")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "s3://conveyor-test/ds/manifest.json")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "not-the-secret")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, gateway->secret_key)) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "Signature=")) << r.output;
}

TEST(S3Radosgw, AnUnknownKeySaysInvalidAccessKeyId) {
  auto env = UserEnv();
  env["AWS_ACCESS_KEY_ID"] = "AKIANOSUCHKEY0000XYZ";
  env["AWS_SESSION_TOKEN"] = "session-token-that-must-not-leak";
  auto r = Cli(env, {"inspect", gateway->s3_ds()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "InvalidAccessKeyId")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "AWS_ACCESS_KEY_ID")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "...0XYZ")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "must-not-leak")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, gateway->secret_key)) << r.output;
}

TEST(S3Radosgw, AMissingObjectOrBucketNamesBucketAndKey) {
  SetProcessEnv(UserEnv());
  auto storage = OpenStorage(gateway->s3_ds());
  ASSERT_TRUE(storage.ok()) << storage.status();
  auto missing = (*storage)->Open("no/such key.bin");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "NoSuchKey")) << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "bucket 'conveyor-test'"));
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "'ds/no/such key.bin'"));
  EXPECT_EQ((*storage)->stats().retries, 0u);

  auto other = OpenStorage("s3://no-such-bucket-here/ds");
  ASSERT_TRUE(other.ok()) << other.status();
  auto nobucket = (*other)->Open("manifest.json");
  EXPECT_EQ(nobucket.status().code(), absl::StatusCode::kNotFound) << nobucket.status();
  EXPECT_TRUE(absl::StrContains(nobucket.status().message(), "NoSuchBucket")) << nobucket.status();
  EXPECT_TRUE(absl::StrContains(nobucket.status().message(), "no-such-bucket-here"));
}

TEST(S3Radosgw, KeysThatNeedPercentEncodingAreSigned) {
  // aws s3 cp put "odd name+=~(1).bin" in SetUp; SigV4 signs the encoded path.
  SetProcessEnv(UserEnv());
  auto storage = OpenStorage(std::string("s3://") + kBucket + "/");
  ASSERT_TRUE(storage.ok()) << storage.status();
  auto f = (*storage)->Open("odd dir/odd name+=~(1).bin");
  ASSERT_TRUE(f.ok()) << f.status();
  std::string got((*f)->size(), '\0');
  ASSERT_TRUE((*f)->Read(0, got.size(), got.data()).ok());
  EXPECT_EQ(got, "odd bytes\n");
}

// 503s, resets and bodies cut short between the backend and radosgw: retried, and the batches
// are the local copy's, bit for bit.
TEST(S3Radosgw, FaultsThroughAProxyStillGiveIdenticalDigests) {
  auto proxy = FaultProxy::Start(gateway->port);
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  std::string endpoint = (*proxy)->base_url();
  endpoint.pop_back();  // no trailing '/'
  std::vector<FaultAction> plan;
  for (int i = 0; i < 4; ++i) {
    plan.push_back(FaultAction::PassThrough());
    plan.push_back(FaultAction::Respond503());
    plan.push_back(FaultAction::PassThrough());
    plan.push_back(FaultAction::Reset());
    plan.push_back(FaultAction::PassThrough());
    plan.push_back(FaultAction::CutBodyAfter(100));
  }
  (*proxy)->Enqueue(plan);
  const std::vector<std::string> local = Digests({}, gateway->local_ds());
  auto env = UserEnv(endpoint);
  auto r = RunCommand(Env(env) + ShellCommand({kCli, "batches", gateway->s3_ds(), "--config",
                                               gateway->config(), "--steps", "6", "--digest",
                                               "--stats", "--threads", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ((*proxy)->actions_left(), 0u) << "not every fault was met";
  EXPECT_EQ(BatchLines(r.output), local) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "storage:")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, " 0 retries")) << "no retry was counted: " << r.output;
}

// The node-local cache: a second run reads no object bytes from radosgw, and says so.
TEST(S3Radosgw, ASecondRunIsServedFromTheCache) {
  TempDir cache;
  auto env = UserEnv();
  env["CONVEYOR_CACHE_DIR"] = cache.path();
  const std::vector<std::string> local = Digests({}, gateway->local_ds());
  auto run = [&] {
    auto r = RunCommand(Env(env) + ShellCommand({kCli, "batches", gateway->s3_ds(), "--config",
                                                 gateway->config(), "--steps", "6", "--digest",
                                                 "--stats"}));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const std::string cold = run();
  const std::string warm = run();
  EXPECT_FALSE(absl::StrContains(cold, "misses 0 ")) << cold;
  EXPECT_TRUE(absl::StrContains(warm, "storage: 0 reads, 0 bytes")) << warm;
  EXPECT_FALSE(absl::StrContains(warm, "cache hits 0 ")) << warm;
  EXPECT_TRUE(absl::StrContains(warm, "misses 0 ")) << warm;
  EXPECT_EQ(BatchLines(cold), local);
  EXPECT_EQ(BatchLines(warm), local);
}

// A LeRobot v3.0 dataset (the fixture of tests/lerobot_import_test.cc, uploaded as it is) read in
// place from the bucket: the same batches as the local directory; then imported from the bucket
// into the native format, whose samples equal those of a local import.
TEST(S3Radosgw, ALeRobotDatasetInTheBucketReadsInPlaceAndImports) {
  if (gateway->lerobot_skip.size()) GTEST_SKIP() << gateway->lerobot_skip;
  const std::string local = gateway->lerobot_local();
  const std::string remote = std::string("s3://") + kBucket + "/lerobot_v30/";
  const std::string config = gateway->dir->Join("lerobot.yaml");
  testing::WriteFile(config, R"(anchor: action
streams:
  observation.images.top: {delta_timestamps: [-0.0333333, 0.0]}
  observation.images.wrist: {delta_timestamps: [0.0]}
  observation.state: {delta_timestamps: [0.0], normalize: mean_std}
  action: {delta_timestamps: {start: 0.0, step: 0.0333333, count: 5}}
  instruction: {}
pipeline: {global_batch_size: 4, seed: 3, schedule: {mode: gop}}
)");
  auto env = UserEnv();
  env["CONVEYOR_INDEX_CACHE_DIR"] = gateway->dir->Join("index-cache");
  const std::vector<std::string> want = Digests(env, local, "", config);
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(Digests(env, remote, "", config), want);
  EXPECT_EQ(Digests(env, remote, "", config), want);  // the mp4 indexes from the cache (ETag key)
  auto r = Cli(env, {"import", "--lerobot", remote, "--out", gateway->dir->Join("imported_s3"),
                     "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Cli(env, {"import", "--lerobot", local, "--out", gateway->dir->Join("imported_local"),
                "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Every sample of the two imports, byte for byte (their shuffled orders differ: each episode
  // index records where it came from, which is part of the fingerprint that keys the order).
  for (const char* which : {"imported_s3", "imported_local"}) {
    r = Cli(env, {"sample", gateway->dir->Join(which), "--config", config, "--count", "42",
                  "--stride", "1", "--out", gateway->dir->Join(std::string("samples_") + which)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  r = RunCommand(ShellCommand({"diff", "-r", "-x", "summary.json",
                               gateway->dir->Join("samples_imported_s3"),
                               gateway->dir->Join("samples_imported_local")}) + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// An RLDS dataset (tests/fixtures/rlds/make_rlds.py, uploaded as it is) read in place from the
// bucket: the same batches as the local folder, the second time from the record index cache.
TEST(S3Radosgw, AnRldsDatasetInTheBucketReadsInPlace) {
  if (gateway->rlds_skip.size()) GTEST_SKIP() << gateway->rlds_skip;
  const std::string local = gateway->dir->Join("rlds/clean");
  const std::string remote = std::string("s3://") + kBucket + "/rlds_clean/";
  const std::string config = gateway->dir->Join("rlds.yaml");
  testing::WriteFile(config, R"(anchor: action
streams:
  observation.image: {delta_timestamps: [-1, 0]}
  observation.wrist_image: {delta_timestamps: [0]}
  observation.state: {delta_timestamps: [0], normalize: mean_std}
  action: {delta_timestamps: {start: 0, step: 1, count: 3}}
  instruction: {}
pipeline: {global_batch_size: 4, seed: 3, schedule: {mode: gop}}
)");
  auto env = UserEnv();
  env["CONVEYOR_INDEX_CACHE_DIR"] = gateway->dir->Join("index-cache");
  const std::vector<std::string> want = Digests(env, local, "", config);
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(Digests(env, remote, "", config), want);
  EXPECT_EQ(Digests(env, remote, "", config), want);  // the record indexes from the cache (ETag key)
}

// `conveyor serve s3://...` with the usual AWS environment, and `conveyor fetch` and the Python
// Loader fetching from it: exactly the local copy's batches.
TEST(S3Radosgw, ServingFromTheBucketGivesTheLocalBatches) {
  const std::vector<std::string> local = Digests({}, gateway->local_ds());
  ASSERT_EQ(local.size(), 6u);
  SetProcessEnv(UserEnv());  // the server process inherits it
  testing::ServerProcess server(kCli, {gateway->s3_ds(), "--config", gateway->config(), "--threads",
                                       "2"},
                                gateway->dir->path());
  ASSERT_TRUE(server.ok()) << server.log();
  auto r = RunCommand(ShellCommand({kCli, "fetch", "--servers", server.address(), "--steps", "6",
                                    "--digest"}) +
                      " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output << server.log();
  EXPECT_EQ(testing::SplitLines(r.output), local);
  // The Python Loader on the same server: the same batches (its digest is the CLI's,
  // python/tests/conveyor_test_support.py).
  const std::string python_dir = std::string(CONVEYOR_BINARY_DIR) + "/python";
  if (access((python_dir + "/conveyor").c_str(), F_OK) == 0) {
    const std::string script =
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "import conveyor, conveyor_test_support as t\n"
        "for b in conveyor.Loader(servers=[sys.argv[3]], max_batches=6, reconnect_timeout_s=30):\n"
        "    c = b['_cursor']; print('%d:%d %s' % (int(c[0]), int(c[1]), t.digest(b)))\n";
    testing::WriteFile(gateway->dir->Join("loader.py"), script);
    auto py = RunCommand(ShellCommand({"/usr/bin/python3", gateway->dir->Join("loader.py"), python_dir,
                                       std::string(CONVEYOR_SOURCE_DIR) + "/python/tests",
                                       server.address()}) +
                         " 2>&1");
    ASSERT_EQ(py.exit_code, 0) << py.output;
    const std::vector<std::string> lines = testing::SplitLines(py.output);
    ASSERT_EQ(lines.size(), local.size()) << py.output;
    for (size_t i = 0; i < lines.size(); ++i) {
      // "E:S <sha256>" against the CLI line "E:S consumer 0/1 samples N ids X sha256 <sha256>".
      const std::string cursor = lines[i].substr(0, lines[i].find(' '));
      const std::string sha = lines[i].substr(lines[i].find(' ') + 1);
      EXPECT_EQ(local[i].substr(0, cursor.size() + 1), cursor + " ") << local[i];
      EXPECT_NE(local[i].find("sha256 " + sha), std::string::npos) << local[i] << " vs " << lines[i];
    }
  }
  EXPECT_FALSE(absl::StrContains(server.log(), gateway->secret_key));
}

// Starts the gateway, creates the user's bucket and uploads the dataset; "" or why not.
std::string StartGateway() {
  gateway = new Gateway;
  gateway->dir = std::make_unique<TempDir>();
  if (access(kAws.c_str(), X_OK) != 0) return kAws + " is missing (bash tools/setup.sh installs awscli)";
  auto started = RunCommand(ShellCommand({kScript, "start", gateway->dir->Join("ceph")}) + " 2>&1", 180);
  if (started.exit_code == 77 || started.exit_code != 0) {
    return "radosgw did not start: " + started.output;
  }
  // The last line: RGW_PORT=... RGW_ACCESS_KEY=... RGW_SECRET_KEY=...
  const std::vector<std::string> lines = testing::SplitLines(started.output);
  for (absl::string_view field : absl::StrSplit(lines.back(), ' ')) {
    if (absl::ConsumePrefix(&field, "RGW_PORT=")) gateway->port = std::atoi(std::string(field).c_str());
    if (absl::ConsumePrefix(&field, "RGW_ACCESS_KEY=")) gateway->access_key = std::string(field);
    if (absl::ConsumePrefix(&field, "RGW_SECRET_KEY=")) gateway->secret_key = std::string(field);
  }
  if (gateway->port == 0 || gateway->secret_key.empty()) {
    std::fprintf(stderr, "unexpected output of radosgw.sh:\n%s\n", started.output.c_str());
    return "";  // a failure, not a skip: the tests below fail
  }
  testing::WriteFile(gateway->config(), kConfig);
  const std::string env = Env({{"AWS_ACCESS_KEY_ID", gateway->access_key},
                               {"AWS_SECRET_ACCESS_KEY", gateway->secret_key},
                               {"AWS_REGION", "us-east-1"},
                               {"AWS_EC2_METADATA_DISABLED", "true"},
                               {"HOME", gateway->dir->path()}});
  const std::string aws = env + kAws + " --endpoint-url " + gateway->endpoint() + " ";
  testing::WriteFile(gateway->dir->Join("odd"), "odd bytes\n");
  for (const std::string& cmd :
       {ShellCommand({kCli, "synth", "--out", gateway->local_ds(), "--episodes", "3",
                      "--cameras", "1", "--size", "64x64", "--episode-seconds", "2",
                      "--audio-codec", "none", "--quiet"}),
        aws + "s3 mb s3://" + kBucket,
        aws + "s3 cp --only-show-errors --recursive " + ShellQuote(gateway->local_ds()) +
            " s3://" + kBucket + "/ds",
        aws + "s3 cp --only-show-errors " + ShellQuote(gateway->dir->Join("odd")) + " " +
            ShellQuote(std::string("s3://") + kBucket + "/odd dir/odd name+=~(1).bin")}) {
    auto r = RunCommand(cmd + " 2>&1", 300);
    if (r.exit_code != 0) {
      std::fprintf(stderr, "setup failed: %s\n%s\n", cmd.c_str(), r.output.c_str());
      return "";
    }
  }
  // The LeRobot fixture (made with node and ffmpeg by the script the LeRobot tests share).
  auto made = RunCommand("command -v node && command -v npm && bash " +
                             ShellQuote(std::string(CONVEYOR_SOURCE_DIR) +
                                        "/tests/fixtures/lerobot/make_lerobot.sh") +
                             " " + ShellQuote(CONVEYOR_PARQUET_NPM_DIR) + " " +
                             ShellQuote(CONVEYOR_LEROBOT_FIXTURE_DIR) + " 2>&1",
                         600);
  if (made.exit_code != 0) {
    gateway->lerobot_skip = "the LeRobot fixture could not be made (node, npm?): " + made.output;
  } else {
    auto up = RunCommand(aws + "s3 cp --only-show-errors --recursive " +
                             ShellQuote(gateway->lerobot_local()) + " s3://" + kBucket +
                             "/lerobot_v30 2>&1",
                         300);
    if (up.exit_code != 0) {
      std::fprintf(stderr, "setup failed: uploading the LeRobot fixture\n%s\n", up.output.c_str());
      return "";
    }
  }
  // The RLDS fixture (python3-protobuf records, tests/fixtures/rlds/make_rlds.py), uploaded as is.
  auto rlds = RunCommand("/usr/bin/python3 " +
                             ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/rlds/make_rlds.py") +
                             " " + ShellQuote(gateway->dir->Join("rlds")) + " 2>&1 && " + aws +
                             "s3 cp --only-show-errors --recursive " + ShellQuote(gateway->dir->Join("rlds/clean")) +
                             " s3://" + kBucket + "/rlds_clean 2>&1",
                         300);
  if (rlds.exit_code != 0) gateway->rlds_skip = "the RLDS fixture could not be made or uploaded: " + rlds.output;
  return "";
}

void StopGateway() {
  if (gateway == nullptr) return;
  RunCommand(ShellCommand({kScript, "stop", gateway->dir->Join("ceph")}), 60);
  delete gateway;
  gateway = nullptr;
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string skip = conveyor::StartGateway();
  if (!skip.empty()) {
    std::fprintf(stderr, "SKIPPED: %s\n", skip.c_str());
    conveyor::StopGateway();
    return 77;
  }
  const int rc = RUN_ALL_TESTS();
  conveyor::StopGateway();
  return rc;
}
