#include <gtest/gtest.h>

#include "storage/storage.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using testing::TempDir;

TEST(LocalStorage, ReadsExactRanges) {
  TempDir dir;
  std::string bytes;
  for (int i = 0; i < 100000; ++i) bytes.push_back(static_cast<char>(i * 7));
  testing::WriteFile(dir.Join("f.bin"), bytes);
  auto storage = OpenStorage(dir.path());
  ASSERT_TRUE(storage.ok()) << storage.status();
  auto file = (*storage)->Open("f.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), bytes.size());
  std::string got(1000, '\0');
  ASSERT_TRUE((*file)->Read(12345, 1000, got.data()).ok());
  EXPECT_EQ(got, bytes.substr(12345, 1000));
  EXPECT_EQ((*storage)->stats().reads, 1u);
  EXPECT_EQ((*storage)->stats().bytes_read, 1000u);
}

TEST(LocalStorage, ReadPastEndNamesFileAndRange) {
  TempDir dir;
  testing::WriteFile(dir.Join("small.bin"), "abc");
  auto storage = OpenStorage("file://" + dir.path());
  ASSERT_TRUE(storage.ok());
  auto file = (*storage)->Open("small.bin");
  ASSERT_TRUE(file.ok());
  char buf[8];
  absl::Status s = (*file)->Read(2, 5, buf);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("small.bin"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("offset 2"), std::string_view::npos) << s;
}

TEST(LocalStorage, MissingFileIsNotFound) {
  TempDir dir;
  auto storage = OpenStorage(dir.path());
  ASSERT_TRUE(storage.ok());
  auto file = (*storage)->Open("nope.bin");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("nope.bin"), std::string_view::npos);
}

TEST(OpenStorage, RejectsUnknownSchemesAndBadBuckets) {
  EXPECT_EQ(OpenStorage("ftp://x/y").status().code(), absl::StatusCode::kInvalidArgument);
  // s3:// is a backend now (tests/s3_config_test.cc, tests/s3/); a malformed bucket is refused.
  auto s3 = OpenStorage("s3://b/prefix");
  EXPECT_EQ(s3.status().code(), absl::StatusCode::kInvalidArgument) << s3.status();
  EXPECT_EQ(OpenStorage("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor
