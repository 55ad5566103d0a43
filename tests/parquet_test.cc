// The Parquet reader (datasets/parquet) against files written by two independent writers, npm's
// parquet-wasm (arrow-rs) and hyparquet-writer, made at test time by
// tests/fixtures/parquet/make_fixtures.sh, whose expected.json holds the values each writer was
// given; and against hand-made malformed files, each of which must give a clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "datasets/parquet/parquet_file.h"
#include "storage/storage.h"
#include "tests/support/test_env.h"

namespace conveyor::parquet {
namespace {

using ::conveyor::testing::ReadFile;
using ::conveyor::testing::RunCommand;
using ::conveyor::testing::ShellQuote;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Fixtures from the independent writers.

// The fixtures live in the build tree (CONVEYOR_PARQUET_NPM_DIR/fixtures), written by the first
// test process that needs them and reused while the script and the writers are unchanged.
struct Fixtures {
  std::string skip_reason;  // non-empty: npm is not installed
  std::string error;        // non-empty: the script failed
  std::string dir;
  json expected;

  std::string Join(const std::string& file) const { return dir + "/" + file; }
};

const Fixtures& GetFixtures() {
  static const Fixtures* fixtures = [] {
    auto* f = new Fixtures;
    if (RunCommand("command -v npm && command -v node", 10).exit_code != 0) {
      f->skip_reason = "npm/node not installed: the Parquet fixtures are written by npm packages";
      return f;
    }
    f->dir = std::string(CONVEYOR_PARQUET_NPM_DIR) + "/fixtures";
    const std::string script =
        std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/parquet/make_fixtures.sh";
    const auto result =
        RunCommand("bash " + ShellQuote(script) + " " + ShellQuote(CONVEYOR_PARQUET_NPM_DIR) + " " +
                       ShellQuote(f->dir),
                   600);
    if (result.exit_code != 0) {
      f->error = "make_fixtures.sh failed:\n" + result.output;
      return f;
    }
    f->expected = json::parse(ReadFile(f->Join("expected.json")));
    return f;
  }();
  return *fixtures;
}

#define REQUIRE_FIXTURES()                                           \
  do {                                                               \
    if (!GetFixtures().skip_reason.empty()) {                        \
      GTEST_SKIP() << GetFixtures().skip_reason;                     \
    }                                                                \
    ASSERT_TRUE(GetFixtures().error.empty()) << GetFixtures().error; \
  } while (0)

std::string Hex(std::string_view s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// Value slot i as JSON, in expected.json's conventions (int64 as a decimal string, binary as hex).
json ValueJson(const Column& c, size_t i, const std::string& type) {
  if (!c.valid[i]) return nullptr;
  return std::visit(
      [&](const auto& v) -> json {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, BinaryValues>) {
          if (type.find("binary") != std::string::npos) return Hex(v[i]);
          return std::string(v[i]);
        } else if constexpr (std::is_same_v<V, std::vector<uint8_t>>) {
          return v[i] != 0;
        } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          return std::to_string(v[i]);
        } else if constexpr (std::is_same_v<V, std::vector<float>>) {
          return static_cast<double>(v[i]);
        } else {
          return v[i];
        }
      },
      c.values);
}

// Slot i of list level k (or of the values when k == lists.size()) as JSON.
json SlotJson(const Column& c, size_t k, size_t i, const std::string& type) {
  if (k == c.lists.size()) return ValueJson(c, i, type);
  const ListLevel& level = c.lists[k];
  if (!level.valid[i]) return nullptr;
  json out = json::array();
  for (int64_t j = level.offsets[i]; j < level.offsets[i + 1]; ++j) {
    out.push_back(SlotJson(c, k + 1, static_cast<size_t>(j), type));
  }
  return out;
}

// Checks the Arrow-layout invariants, then returns the column as one JSON value per row.
json RowsJson(const Column& c, const std::string& type) {
  EXPECT_EQ(std::visit([](const auto& v) { return v.size(); }, c.values), c.valid.size());
  for (size_t k = 0; k < c.lists.size(); ++k) {
    const ListLevel& level = c.lists[k];
    EXPECT_EQ(level.offsets.size(), level.valid.size() + 1);
    const size_t children = k + 1 < c.lists.size() ? c.lists[k + 1].valid.size() : c.valid.size();
    EXPECT_EQ(static_cast<size_t>(level.offsets.back()), children) << "list level " << k;
  }
  const size_t rows = c.lists.empty() ? c.valid.size() : c.lists[0].valid.size();
  EXPECT_EQ(static_cast<int64_t>(rows), c.num_rows);
  json out = json::array();
  for (size_t r = 0; r < rows; ++r) out.push_back(SlotJson(c, 0, r, type));
  return out;
}

const json& ExpectedFile(const std::string& file) {
  for (const json& f : GetFixtures().expected["files"]) {
    if (f["file"] == file) return f;
  }
  static const json missing;
  ADD_FAILURE() << file << " is not in expected.json";
  return missing;
}

absl::StatusOr<ParquetFile> OpenFixture(const std::string& file,
                                        const ParquetReadOptions& options = {}) {
  return ParquetFile::OpenBytes(file, ReadFile(GetFixtures().Join(file)), options);
}

// Every fixture make_fixtures.mjs writes (the test checks that expected.json lists exactly these).
const char* const kFixtureFiles[] = {
    "lerobot_arrow_v1_uncompressed.parquet",
    "lerobot_arrow_v1_snappy.parquet",
    "lerobot_arrow_v1_gzip.parquet",
    "lerobot_arrow_v1_zstd.parquet",
    "lerobot_arrow_v2_zstd.parquet",
    "lerobot_arrow_v2_delta.parquet",
    "lerobot_arrow_dict_fallback.parquet",
    "lerobot_arrow_fixed26.parquet",
    "nested_arrow_v1.parquet",
    "nested_arrow_v2.parquet",
    "lerobot_hyparquet_uncompressed.parquet",
    "lerobot_hyparquet_snappy.parquet",
    "lerobot_hyparquet_gzip.parquet",
    "nested_hyparquet.parquet",
    "encodings_hyparquet.parquet",
};

class WrittenByAnotherWriter : public ::testing::TestWithParam<const char*> {};

TEST_P(WrittenByAnotherWriter, EveryColumnEqualsWhatTheWriterWasGiven) {
  REQUIRE_FIXTURES();
  const std::string file = GetParam();
  const json& expected = ExpectedFile(file);
  ASSERT_FALSE(expected.is_null());
  absl::StatusOr<ParquetFile> pf = OpenFixture(file);
  ASSERT_TRUE(pf.ok()) << pf.status();
  EXPECT_EQ(pf->num_rows(), expected["num_rows"].get<int64_t>());
  EXPECT_EQ(pf->num_row_groups(), expected["row_groups"].get<int>());
  EXPECT_FALSE(pf->created_by().empty());
  ASSERT_GE(expected["columns"].size(), 4u);
  for (const auto& [name, col] : expected["columns"].items()) {
    SCOPED_TRACE(name);
    const std::string type = col["type"];
    absl::StatusOr<Column> c = pf->ReadColumn(name);
    ASSERT_TRUE(c.ok()) << c.status();
    const json rows = RowsJson(*c, type);
    const json& want = col["values"];
    ASSERT_EQ(rows.size(), want.size());
    int mismatches = 0;
    for (size_t r = 0; r < rows.size() && mismatches < 5; ++r) {
      if (rows[r] != want[r]) {
        ++mismatches;
        ADD_FAILURE() << file << " column " << name << " row " << r << ": read " << rows[r].dump()
                      << ", written " << want[r].dump();
      }
    }
    // The type the reader reports agrees with what was written.
    const bool is_list = type.rfind("list<", 0) == 0;
    EXPECT_EQ(c->descriptor.max_repetition_level,
              is_list ? (type.rfind("list<list<", 0) == 0 ? 2 : 1) : 0);
    const std::string leaf =
        is_list ? type.substr(type.rfind('<') + 1, type.find('>') - type.rfind('<') - 1) : type;
    const std::map<std::string, PhysicalType> physical = {
        {"float", PhysicalType::kFloat},     {"double", PhysicalType::kDouble},
        {"int32", PhysicalType::kInt32},     {"int64", PhysicalType::kInt64},
        {"bool", PhysicalType::kBoolean},    {"string", PhysicalType::kByteArray},
        {"binary", PhysicalType::kByteArray}};
    EXPECT_EQ(c->descriptor.physical_type, physical.at(leaf)) << leaf;
    if (leaf == "string") {
      EXPECT_TRUE(c->descriptor.converted_type == ConvertedType::kUtf8 ||
                  c->descriptor.logical_type.kind == LogicalType::Kind::kString);
    }
    int64_t nulls = 0;
    for (uint8_t v : c->valid) nulls += v == 0;
    EXPECT_EQ(c->null_count, nulls);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WrittenByAnotherWriter, ::testing::ValuesIn(kFixtureFiles),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           n = n.substr(0, n.find('.'));
                           return n;
                         });

TEST(ParquetFixtures, ExpectedJsonListsExactlyTheTestedFiles) {
  REQUIRE_FIXTURES();
  std::vector<std::string> listed;
  for (const json& f : GetFixtures().expected["files"]) listed.push_back(f["file"]);
  EXPECT_EQ(listed, std::vector<std::string>(std::begin(kFixtureFiles), std::end(kFixtureFiles)));
}

TEST(ParquetFixtures, ReadingRowGroupsOneByOneEqualsReadingTheWholeColumn) {
  REQUIRE_FIXTURES();
  absl::StatusOr<ParquetFile> pf = OpenFixture("lerobot_hyparquet_snappy.parquet");
  ASSERT_TRUE(pf.ok()) << pf.status();
  ASSERT_EQ(pf->num_row_groups(), 3);
  for (const char* name : {"observation.state", "annotation", "next.done"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<Column> whole = pf->ReadColumn(name);
    ASSERT_TRUE(whole.ok()) << whole.status();
    json parts = json::array();
    int64_t rows = 0;
    for (int g = 0; g < pf->num_row_groups(); ++g) {
      absl::StatusOr<Column> part = pf->ReadColumn(name, g);
      ASSERT_TRUE(part.ok()) << part.status();
      EXPECT_EQ(part->num_rows, pf->row_group_num_rows(g));
      rows += part->num_rows;
      for (json& row : RowsJson(*part, "")) parts.push_back(std::move(row));
    }
    EXPECT_EQ(rows, pf->num_rows());
    EXPECT_EQ(parts, RowsJson(*whole, ""));
  }
}

TEST(ParquetFixtures, SchemaOfALeRobotTable) {
  REQUIRE_FIXTURES();
  // arrow-rs names the list element "item"; hyparquet (like pyarrow today) "element".
  for (const auto& [file, element] : std::vector<std::pair<std::string, std::string>>{
           {"lerobot_arrow_v1_snappy.parquet", "item"},
           {"lerobot_hyparquet_snappy.parquet", "element"}}) {
    SCOPED_TRACE(file);
    absl::StatusOr<ParquetFile> pf = OpenFixture(file);
    ASSERT_TRUE(pf.ok()) << pf.status();
    absl::StatusOr<const ColumnDescriptor*> state = pf->FindColumn("observation.state");
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ((*state)->path, "observation.state.list." + element);
    EXPECT_EQ((*state)->path_parts,
              (std::vector<std::string>{"observation.state", "list", element}));
    EXPECT_EQ((*state)->physical_type, PhysicalType::kFloat);
    EXPECT_EQ((*state)->max_repetition_level, 1);
    // Optional list, repeated group, and (arrow-rs) an optional element.
    EXPECT_EQ((*state)->max_definition_level, element == "item" ? 3 : 2);
    absl::StatusOr<const ColumnDescriptor*> by_leaf =
        pf->FindColumn("observation.state.list." + element);
    ASSERT_TRUE(by_leaf.ok());
    EXPECT_EQ(*by_leaf, *state);
    // The group node carries the LIST annotation.
    const SchemaNode& group =
        pf->schema()[pf->schema()[pf->schema()[(*state)->node].parent].parent];
    EXPECT_EQ(group.name, "observation.state");
    EXPECT_EQ(group.converted_type, ConvertedType::kList);
    EXPECT_EQ(pf->schema()[0].children.size(), 11u);

    absl::StatusOr<const ColumnDescriptor*> missing = pf->FindColumn("observation.image");
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(missing.status().message().find("observation.state"), std::string::npos)
        << missing.status();
  }
  absl::StatusOr<ParquetFile> nested = OpenFixture("nested_arrow_v1.parquet");
  ASSERT_TRUE(nested.ok()) << nested.status();
  absl::StatusOr<const ColumnDescriptor*> point = nested->FindColumn("point");
  EXPECT_EQ(point.status().code(), absl::StatusCode::kInvalidArgument) << point.status();
  absl::StatusOr<const ColumnDescriptor*> ts =
      OpenFixture("lerobot_arrow_v1_snappy.parquet")->FindColumn("timestamp");
  ASSERT_TRUE(ts.ok());
  EXPECT_EQ((*ts)->max_definition_level, 1);  // arrow-rs writes nullable fields as OPTIONAL
}

TEST(ParquetFixtures, RangeReadsTouchTheFooterAndTheRequestedColumnOnly) {
  REQUIRE_FIXTURES();
  const std::string bytes = ReadFile(GetFixtures().Join("lerobot_arrow_v1_zstd.parquet"));
  struct Counter {
    int reads = 0;
    uint64_t bytes = 0;
  };
  auto counter = std::make_shared<Counter>();
  ReadRangeFn read = [&bytes, counter](uint64_t offset,
                                       uint64_t length) -> absl::StatusOr<std::string> {
    ++counter->reads;
    counter->bytes += length;
    if (offset > bytes.size() || length > bytes.size() - offset) {
      return absl::OutOfRangeError("past the end");
    }
    return bytes.substr(offset, length);
  };
  ParquetReadOptions options;
  options.footer_read_hint = 1024;  // smaller than this footer: Open needs a second read
  absl::StatusOr<ParquetFile> pf =
      ParquetFile::Open("counted.parquet", bytes.size(), read, options);
  ASSERT_TRUE(pf.ok()) << pf.status();
  EXPECT_EQ(counter->reads, 2);
  *counter = Counter();
  absl::StatusOr<Column> c = pf->ReadColumn("task_index");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(counter->reads, pf->num_row_groups());  // one read per column chunk
  EXPECT_LT(counter->bytes * 10, bytes.size());     // a small part of the file
}

TEST(ParquetFixtures, ReadsThroughTheStorageSeam) {
  REQUIRE_FIXTURES();
  std::unique_ptr<Storage> storage = NewLocalStorage(GetFixtures().dir);
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file =
      storage->Open("lerobot_hyparquet_gzip.parquet");
  ASSERT_TRUE(file.ok()) << file.status();
  const RandomAccessFile* f = file->get();
  ReadRangeFn read = [f](uint64_t offset, uint64_t length) -> absl::StatusOr<std::string> {
    std::string out(length, '\0');
    absl::Status s = f->Read(offset, length, out.data());
    if (!s.ok()) return s;
    return out;
  };
  absl::StatusOr<ParquetFile> pf = ParquetFile::Open(f->name(), f->size(), read);
  ASSERT_TRUE(pf.ok()) << pf.status();
  absl::StatusOr<Column> action = pf->ReadColumn("action");
  ASSERT_TRUE(action.ok()) << action.status();
  ASSERT_EQ(action->lists.size(), 1u);
  EXPECT_EQ(action->lists[0].offsets.size(), 301u);
  EXPECT_EQ(action->lists[0].offsets.back(), 300 * 26);
}

// Every single-byte corruption of a real file gives OK or an error: never a crash, and (under the
// fuzz build's sanitizers) never undefined behaviour.
TEST(ParquetFixtures, CorruptedBytesGiveErrorsNotCrashes) {
  REQUIRE_FIXTURES();
  for (const char* file :
       {"nested_arrow_v1.parquet", "nested_arrow_v2.parquet", "nested_hyparquet.parquet"}) {
    const std::string good = ReadFile(GetFixtures().Join(file));
    int errors = 0;
    for (size_t pos = 0; pos < good.size(); pos += 3) {
      std::string bad = good;
      bad[pos] = static_cast<char>(bad[pos] ^ (0x5a + pos));
      ParquetReadOptions options;
      options.max_column_bytes = 64 << 20;
      absl::StatusOr<ParquetFile> pf = ParquetFile::OpenBytes("bad.parquet", bad, options);
      if (!pf.ok()) {
        ++errors;
        EXPECT_NE(pf.status().message().find("bad.parquet"), std::string::npos) << pf.status();
        continue;
      }
      for (const ColumnDescriptor& c : pf->columns()) {
        absl::StatusOr<Column> col = pf->ReadColumn(c, 0, pf->num_row_groups());
        if (!col.ok()) {
          ++errors;
          EXPECT_NE(col.status().message().find("bad.parquet"), std::string::npos) << col.status();
        }
      }
    }
    EXPECT_GT(errors, 0) << file;
  }
}

// ---------------------------------------------------------------------------------------------
// Hand-made files: a minimal Thrift compact writer builds exact (mal)formations.

class ThriftWriter {
 public:
  void Field(int16_t id, uint8_t type) {
    const int delta = id - last_.back();
    if (delta > 0 && delta <= 15) {
      Byte(static_cast<uint8_t>(delta << 4 | type));
    } else {
      Byte(type);
      Varint(ZigZag(id));
    }
    last_.back() = id;
  }
  void I32(int16_t id, int64_t v) { Field(id, 5), Varint(ZigZag(v)); }
  void I64(int16_t id, int64_t v) { Field(id, 6), Varint(ZigZag(v)); }
  void Binary(int16_t id, const std::string& s) { Field(id, 8), Str(s); }
  void Str(const std::string& s) { Varint(s.size()), out_ += s; }
  void BeginStruct(int16_t id) { Field(id, 12), last_.push_back(0); }
  void BeginElement() { last_.push_back(0); }  // a struct as a list element
  void EndStruct() { Byte(0), last_.pop_back(); }
  void List(int16_t id, uint8_t element_type, uint64_t size) {
    Field(id, 9);
    if (size < 15) {
      Byte(static_cast<uint8_t>(size << 4 | element_type));
    } else {
      Byte(static_cast<uint8_t>(0xf0 | element_type));
      Varint(size);
    }
  }
  void Byte(uint8_t b) { out_ += static_cast<char>(b); }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      Byte(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    Byte(static_cast<uint8_t>(v));
  }
  static uint64_t ZigZag(int64_t v) {
    return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
  std::vector<int16_t> last_{0};
};

std::string Le32(uint32_t v) {
  std::string s(4, '\0');
  std::memcpy(s.data(), &v, 4);
  return s;
}

// One INT32 column "x" (REQUIRED, or OPTIONAL), one row group, an optional dictionary page and one
// uncompressed v1 data page with the given body. Fields can be made to lie.
struct HandMade {
  int32_t type = 1;  // INT32
  bool optional = false;
  int32_t num_values = 3;
  int64_t rows = 3;
  int32_t encoding = 0;  // PLAIN
  std::string body = Le32(1) + Le32(2) + Le32(3);
  std::string dictionary;  // PLAIN values; empty: no dictionary page
  int32_t dictionary_count = 0;
  int64_t claimed_page_size = -1;   // compressed_page_size to write; -1: the body's size
  int64_t claimed_chunk_size = -1;  // total_compressed_size; -1: the real size
  int64_t claimed_num_values = -1;  // the column chunk's num_values; -1: num_values

  std::string Build() const {
    std::string file = "PAR1";
    const uint64_t chunk_start = file.size();
    if (!dictionary.empty()) {
      ThriftWriter h;
      h.I32(1, 2);  // DICTIONARY_PAGE
      h.I32(2, static_cast<int64_t>(dictionary.size()));
      h.I32(3, static_cast<int64_t>(dictionary.size()));
      h.BeginStruct(7);
      h.I32(1, dictionary_count);
      h.I32(2, 0);
      h.EndStruct();
      h.Byte(0);
      file += h.out() + dictionary;
    }
    const uint64_t data_start = file.size();
    ThriftWriter h;
    h.I32(1, 0);  // DATA_PAGE
    h.I32(2, static_cast<int64_t>(body.size()));
    h.I32(3, claimed_page_size >= 0 ? claimed_page_size : static_cast<int64_t>(body.size()));
    h.BeginStruct(5);
    h.I32(1, num_values);
    h.I32(2, encoding);
    h.I32(3, 3);  // RLE levels
    h.I32(4, 3);
    h.EndStruct();
    h.Byte(0);
    file += h.out() + body;
    const int64_t chunk_size = static_cast<int64_t>(file.size() - chunk_start);

    ThriftWriter f;
    f.I32(1, 1);
    f.List(2, 12, 2);
    f.BeginElement();
    f.Binary(4, "schema");
    f.I32(5, 1);
    f.EndStruct();
    f.BeginElement();
    f.I32(1, type);
    f.I32(3, optional ? 1 : 0);
    f.Binary(4, "x");
    f.EndStruct();
    f.I64(3, rows);
    f.List(4, 12, 1);
    f.BeginElement();
    f.List(1, 12, 1);
    f.BeginElement();
    f.I64(2, 0);
    f.BeginStruct(3);
    f.I32(1, type);
    f.List(2, 5, 1);
    f.Varint(0);
    f.List(3, 8, 1);
    f.Str("x");
    f.I32(4, 0);  // UNCOMPRESSED
    f.I64(5, claimed_num_values >= 0 ? claimed_num_values : num_values);
    f.I64(6, chunk_size);
    f.I64(7, claimed_chunk_size >= 0 ? claimed_chunk_size : chunk_size);
    f.I64(9, static_cast<int64_t>(data_start));
    if (!dictionary.empty()) f.I64(11, static_cast<int64_t>(chunk_start));
    f.EndStruct();
    f.EndStruct();  // ColumnChunk
    f.I64(2, chunk_size);
    f.I64(3, rows);
    f.EndStruct();  // RowGroup
    f.Byte(0);      // FileMetaData
    file += f.out() + Le32(static_cast<uint32_t>(f.out().size())) + "PAR1";
    return file;
  }
};

absl::StatusOr<Column> ReadX(const std::string& bytes, const ParquetReadOptions& options = {}) {
  absl::StatusOr<ParquetFile> pf = ParquetFile::OpenBytes("hand.parquet", bytes, options);
  if (!pf.ok()) return pf.status();
  return pf->ReadColumn("x");
}

std::vector<int32_t> Int32s(const Column& c) { return std::get<std::vector<int32_t>>(c.values); }

TEST(ParquetHandMade, AValidFileReads) {
  absl::StatusOr<Column> c = ReadX(HandMade().Build());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Int32s(*c), (std::vector<int32_t>{1, 2, 3}));
}

TEST(ParquetHandMade, OptionalWithDictionaryAndNulls) {
  HandMade h;
  h.optional = true;
  h.num_values = 4;
  h.rows = 4;
  h.encoding = 8;  // RLE_DICTIONARY
  h.dictionary = Le32(10) + Le32(20);
  h.dictionary_count = 2;
  // Definition levels 1,0,1,1 (one bit-packed group of 8, bit width 1), then indices 1,0,1
  // (bit width 1, one bit-packed group).
  const std::string levels = std::string("\x03\x0d", 2);
  h.body = Le32(static_cast<uint32_t>(levels.size())) + levels + std::string("\x01\x03\x05", 3);
  absl::StatusOr<Column> c = ReadX(h.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Int32s(*c), (std::vector<int32_t>{20, 0, 10, 20}));
  EXPECT_EQ(c->valid, (std::vector<uint8_t>{1, 0, 1, 1}));
  EXPECT_EQ(c->null_count, 1);
}

void ExpectError(const absl::StatusOr<Column>& c, absl::StatusCode code,
                 const std::vector<std::string>& fragments) {
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), code) << c.status();
  for (const std::string& f : fragments) {
    EXPECT_NE(c.status().message().find(f), std::string::npos)
        << "'" << f << "' not in: " << c.status().message();
  }
}

TEST(ParquetHandMade, BadMagic) {
  std::string bytes = HandMade().Build();
  bytes.back() = 'X';
  ExpectError(ReadX(bytes), absl::StatusCode::kDataLoss, {"hand.parquet", "not PAR1"});
  bytes = HandMade().Build();
  bytes[0] = 'X';
  ExpectError(ReadX(bytes), absl::StatusCode::kDataLoss, {"first 4 bytes"});
  ExpectError(ReadX("PAR1"), absl::StatusCode::kDataLoss, {"too small"});
}

TEST(ParquetHandMade, TruncatedFile) {
  const std::string good = HandMade().Build();
  // Cut from the front: the footer length now exceeds the file.
  ExpectError(ReadX(good.substr(good.size() - 20)), absl::StatusCode::kDataLoss,
              {"footer length", "truncated"});
  // The footer cut short inside (the trailer re-attached): the Thrift decoder runs out of bytes.
  const uint32_t footer_len = [&] {
    uint32_t v;
    std::memcpy(&v, good.data() + good.size() - 8, 4);
    return v;
  }();
  const size_t footer_start = good.size() - 8 - footer_len;
  const std::string cut =
      good.substr(0, footer_start + footer_len / 2) + Le32(footer_len / 2) + "PAR1";
  ExpectError(ReadX(cut), absl::StatusCode::kDataLoss, {"hand.parquet: footer", "at byte"});
}

TEST(ParquetHandMade, PageLengthPastTheEnd) {
  HandMade h;
  h.claimed_page_size = 1 << 30;
  ExpectError(ReadX(h.Build()), absl::StatusCode::kDataLoss,
              {"hand.parquet: row group 0, column 'x', page 0 at byte 4", "runs past"});
}

TEST(ParquetHandMade, ColumnChunkPastTheEnd) {
  HandMade h;
  h.claimed_chunk_size = 1 << 20;
  ExpectError(ReadX(h.Build()), absl::StatusCode::kDataLoss,
              {"row group 0, column 'x'", "outside the data section"});
}

TEST(ParquetHandMade, DictionaryIndexOutOfRange) {
  HandMade h;
  h.encoding = 8;
  h.dictionary = Le32(10);
  h.dictionary_count = 1;
  h.body = std::string("\x02\x06\x03", 3);  // bit width 2, RLE run of 3 copies of index 3
  ExpectError(ReadX(h.Build()), absl::StatusCode::kDataLoss,
              {"page 1 at byte", "dictionary index 3"});
}

TEST(ParquetHandMade, DefinitionLevelAboveTheMaximum) {
  HandMade h;
  h.optional = true;
  h.body = Le32(2) + std::string("\x06\x02", 2) + Le32(1);  // RLE run of 3 twos; max is 1
  ExpectError(ReadX(h.Build()), absl::StatusCode::kDataLoss, {"definition level"});
}

TEST(ParquetHandMade, RunLengthClaimingBillionsOfValuesHitsTheBudget) {
  HandMade h;
  h.optional = true;
  h.num_values = 1 << 30;
  h.claimed_num_values = 1 << 30;
  h.rows = 1 << 30;
  h.body = Le32(5) + std::string("\x80\x80\x80\x08\x00", 5);  // one RLE run of 2^30 zeros
  ParquetReadOptions options;
  options.max_column_bytes = 16 << 20;
  ExpectError(ReadX(h.Build(), options), absl::StatusCode::kResourceExhausted,
              {"page 0", "max_column_bytes"});
}

TEST(ParquetHandMade, ARunRepeatingALongDictionaryStringHitsTheBudget) {
  HandMade h;
  h.type = 6;  // BYTE_ARRAY
  h.num_values = 1 << 20;
  h.claimed_num_values = 1 << 20;
  h.rows = 1 << 20;
  h.encoding = 8;
  h.dictionary = Le32(4096) + std::string(4096, 'a');
  h.dictionary_count = 1;
  h.body = std::string("\x00\x80\x80\x80\x01", 5);  // bit width 0, an RLE run of 2^20 zeros
  ParquetReadOptions options;
  options.max_column_bytes = 256 << 20;  // enough for the slots, not for 4 GiB of strings
  ExpectError(ReadX(h.Build(), options), absl::StatusCode::kResourceExhausted,
              {"page 1", "strings from the dictionary"});
}

TEST(ParquetHandMade, ValuesMissingFromThePage) {
  HandMade h;
  h.body = Le32(1) + Le32(2);  // 3 values announced
  ExpectError(ReadX(h.Build()), absl::StatusCode::kDataLoss, {"PLAIN values", "8 bytes present"});
}

TEST(ParquetHandMade, RowCountThatDisagrees) {
  HandMade h;
  h.rows = 4;
  absl::StatusOr<ParquetFile> pf = ParquetFile::OpenBytes("hand.parquet", h.Build());
  ASSERT_TRUE(pf.ok()) << pf.status();
  ExpectError(pf->ReadColumn("x"), absl::StatusCode::kDataLoss, {"3 rows, the row group has 4"});
}

TEST(ParquetHandMade, ThriftListLongerThanTheBytesLeft) {
  std::string bytes = HandMade().Build();
  // The schema list header "2 structs" (0x2c after field header 0x19) becomes a 2^28-entry list.
  const size_t footer_start = bytes.size() - 8 - [&] {
    uint32_t v;
    std::memcpy(&v, bytes.data() + bytes.size() - 8, 4);
    return v;
  }();
  const size_t at = bytes.find("\x19\x2c", footer_start);
  ASSERT_NE(at, std::string::npos);
  std::string lie = bytes.substr(0, at) + "\x19\xfc\x80\x80\x80\x80\x01" + bytes.substr(at + 2);
  const uint32_t new_len = static_cast<uint32_t>(lie.size() - 8 - footer_start);
  std::memcpy(lie.data() + lie.size() - 8, &new_len, 4);
  ExpectError(ReadX(lie), absl::StatusCode::kDataLoss, {"footer", "list of 268435456 elements"});
}

}  // namespace
}  // namespace conveyor::parquet
