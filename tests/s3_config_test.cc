// The S3 backend's pieces that need no network: SigV4's URI encoding, s3:// parsing, the AWS
// shared config files, the order in which endpoint, region and credentials are found, and S3's
// XML errors. (tests/s3/ runs the backend against a real radosgw.)
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "storage/internal/s3_internal.h"
#include "tests/support/test_env.h"

namespace conveyor::s3_internal {
namespace {

using testing::TempDir;

// An environment of its own, so the machine's AWS_* variables and ~/.aws never leak in.
EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(S3UriEncode, KeepsUnreservedAndEncodesEverythingElse) {
  EXPECT_EQ(UriEncode("AZaz09-._~", false), "AZaz09-._~");
  EXPECT_EQ(UriEncode("a b+c=d&e/f", true), "a%20b%2Bc%3Dd%26e/f");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(UriEncode("é*!'()", true), "%C3%A9%2A%21%27%28%29");  // upper-case hex, UTF-8 bytes
}

TEST(S3Uri, BucketAndPrefix) {
  auto loc = ParseS3Uri("s3://my-bucket/data/ds");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->bucket, "my-bucket");
  EXPECT_EQ(loc->prefix, "data/ds/");
  loc = ParseS3Uri("s3://my-bucket");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->prefix, "");
  EXPECT_FALSE(ParseS3Uri("s3://ab/x").ok());
  EXPECT_FALSE(ParseS3Uri("s3:///x").ok());
  EXPECT_FALSE(ParseS3Uri("s3://bad bucket/x").ok());
}

TEST(S3Ini, SectionsNestingAndComments) {
  const IniFile ini = ParseIni(
      "# comment\n[default]\naws_access_key_id = AKIDEFAULT\n; other\n"
      "[profile  dev ]\nregion=eu-west-1\ns3 =\n  addressing_style = path\n  endpoint_url = "
      "http://h:1\nAWS_Secret_Access_Key = x=y\n");
  EXPECT_EQ(ini.at("default").at("aws_access_key_id"), "AKIDEFAULT");
  EXPECT_EQ(ini.at("profile dev").at("region"), "eu-west-1");
  EXPECT_EQ(ini.at("profile dev").at("s3.addressing_style"), "path");
  EXPECT_EQ(ini.at("profile dev").at("s3.endpoint_url"), "http://h:1");
  EXPECT_EQ(ini.at("profile dev").at("aws_secret_access_key"), "x=y");  // after nesting ends
}

TEST(S3Config, EnvironmentCredentialsAndEndpointWin) {
  TempDir dir;
  testing::WriteFile(dir.Join("credentials"), "[default]\naws_access_key_id=FROMFILE\naws_secret_access_key=s\n");
  auto c = ResolveS3Config({}, "bucket", FakeEnv({{"AWS_ACCESS_KEY_ID", "AKIAENV"},
                                                 {"AWS_SECRET_ACCESS_KEY", "sekrit"},
                                                 {"AWS_SESSION_TOKEN", "tok"},
                                                 {"AWS_SHARED_CREDENTIALS_FILE", dir.Join("credentials")},
                                                 {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"},
                                                 {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9001"},
                                                 {"AWS_DEFAULT_REGION", "eu-north-1"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:9001");  // the S3-specific variable first
  EXPECT_TRUE(c->path_style);                       // custom endpoint: path-style
  EXPECT_EQ(c->region, "eu-north-1");
  auto cred = c->credentials->Get();
  ASSERT_TRUE(cred.ok()) << cred.status();
  EXPECT_EQ(cred->access_key_id, "AKIAENV");
  EXPECT_EQ(cred->session_token, "tok");
  EXPECT_TRUE(absl::StrContains(c->credentials->origin(), "AWS_SESSION_TOKEN"));
  EXPECT_EQ(ObjectUrl(*c, "bucket", "ds/a b.bin"), "http://127.0.0.1:9001/bucket/ds/a%20b.bin");
}

TEST(S3Config, AwsEndpointIsVirtualHostedWhenTheNameAllows) {
  auto env = FakeEnv({{"AWS_NO_SIGN_REQUEST", "true"}, {"AWS_REGION", "us-west-2"},
                      {"HOME", "/nonexistent"}});
  auto c = ResolveS3Config({}, "open-data", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->credentials->kind(), CredentialSource::Kind::kAnonymous);
  EXPECT_EQ(ObjectUrl(*c, "open-data", "x/y"), "https://open-data.s3.us-west-2.amazonaws.com/x/y");
  auto dotted = ResolveS3Config({}, "open.data", env);
  ASSERT_TRUE(dotted.ok());
  EXPECT_EQ(ObjectUrl(*dotted, "open.data", "k"), "https://s3.us-west-2.amazonaws.com/open.data/k");
  S3Options virt;
  virt.addressing = "virtual";
  EXPECT_FALSE(ResolveS3Config(virt, "open.data", env).ok());
  virt.endpoint = "http://localhost:7480";
  auto forced = ResolveS3Config(virt, "bkt", env);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(ObjectUrl(*forced, "bkt", "k"), "http://bkt.localhost:7480/k");
}

TEST(S3Config, ProfileFromTheSharedFiles) {
  TempDir dir;
  testing::WriteFile(dir.Join("credentials"),
                     "[default]\naws_access_key_id=DEF\naws_secret_access_key=defsecret\n"
                     "[train]\naws_access_key_id=AKIATRAIN\naws_secret_access_key=trainsecret\n");
  testing::WriteFile(dir.Join("config"),
                     "[default]\nregion=us-east-2\n[profile train]\nregion=ap-south-1\n"
                     "endpoint_url = http://10.0.0.1:7480\n");
  auto env = FakeEnv({{"AWS_PROFILE", "train"},
                      {"AWS_SHARED_CREDENTIALS_FILE", dir.Join("credentials")},
                      {"AWS_CONFIG_FILE", dir.Join("config")}});
  auto c = ResolveS3Config({}, "bucket", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->region, "ap-south-1");
  EXPECT_EQ(c->endpoint, "http://10.0.0.1:7480");
  EXPECT_EQ(c->credentials->Get()->access_key_id, "AKIATRAIN");
  EXPECT_TRUE(absl::StrContains(c->credentials->origin(), "profile 'train'"));

  // The option beats AWS_PROFILE; a profile that exists nowhere is an error naming both files.
  S3Options o;
  o.profile = "nope";
  auto missing = ResolveS3Config(o, "bucket", env);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), dir.Join("config")));
}

TEST(S3Config, CredentialProcessRunsAndItsOutputIsNeverQuoted) {
  TempDir dir;
  const std::string script = dir.Join("creds.sh");
  testing::WriteFile(script,
                     "#!/bin/sh\necho '{\"Version\": 1, \"AccessKeyId\": \"AKIAPROC\", "
                     "\"SecretAccessKey\": \"procsecret\", \"SessionToken\": \"proctoken\", "
                     "\"Expiration\": \"2999-01-01T00:00:00Z\"}'\n");
  testing::WriteFile(dir.Join("config"), "[default]\ncredential_process = sh " + script + "\n");
  auto c = ResolveS3Config({}, "bucket", FakeEnv({{"AWS_CONFIG_FILE", dir.Join("config")},
                                                 {"HOME", dir.path()}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->credentials->kind(), CredentialSource::Kind::kProcess);
  auto cred = c->credentials->Get();
  ASSERT_TRUE(cred.ok()) << cred.status();
  EXPECT_EQ(cred->access_key_id, "AKIAPROC");
  EXPECT_EQ(cred->secret_access_key, "procsecret");
  EXPECT_EQ(cred->session_token, "proctoken");
  ASSERT_TRUE(cred->expiration.has_value());

  auto bad = ParseProcessCredentials(R"({"Version": 1, "SecretAccessKey": "leaky"})", "test");
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(absl::StrContains(bad.status().message(), "leaky")) << bad.status();
  EXPECT_FALSE(ParseProcessCredentials("not json leaky", "test").ok());

  testing::WriteFile(dir.Join("config"), "[default]\ncredential_process = sh -c 'exit 3'\n");
  auto failing = ResolveS3Config({}, "bucket", FakeEnv({{"AWS_CONFIG_FILE", dir.Join("config")},
                                                       {"HOME", dir.path()}}));
  ASSERT_TRUE(failing.ok()) << failing.status();
  auto none = failing->credentials->Get();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(none.status().message(), "exit status 3")) << none.status();
}

TEST(S3Config, NoCredentialsSaysWhereItLooked) {
  TempDir dir;
  auto c = ResolveS3Config({}, "bucket", FakeEnv({{"HOME", dir.path()}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "AWS_ACCESS_KEY_ID")) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), dir.path() + "/.aws/credentials"));
  EXPECT_TRUE(absl::StrContains(c.status().message(), "AWS_NO_SIGN_REQUEST"));
  auto half = ResolveS3Config({}, "bucket", FakeEnv({{"AWS_ACCESS_KEY_ID", "A"}}));
  EXPECT_EQ(half.status().code(), absl::StatusCode::kUnauthenticated);
}

TEST(S3Errors, CodeAndMessageFromTheXml) {
  const S3Error e = ParseS3Error(
      R"(<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>The key does not exist</Message><BucketName>b</BucketName></Error>)");
  EXPECT_EQ(e.code, "NoSuchKey");
  EXPECT_EQ(e.message, "The key does not exist");
  EXPECT_EQ(ParseS3Error("<html>503</html>").code, "");
  EXPECT_EQ(MaskKeyId("AKIAABCDEFGHWXYZ"), "...WXYZ");
}

}  // namespace
}  // namespace conveyor::s3_internal
