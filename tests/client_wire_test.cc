// The client's hand-written parser of StreamBatchesResponse against protobuf's own encoder, with
// the message cut into slices at every kind of boundary, unknown fields, and truncations.
#include <gtest/gtest.h>

#include <random>

#include "client/internal/wire.h"

namespace conveyor::client::wire {
namespace {

namespace pb = ::conveyor::v1;

std::vector<grpc::Slice> Cut(const std::string& bytes, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> out;
  size_t b = 0;
  for (size_t c : cuts) {
    if (c <= b || c >= bytes.size()) continue;
    out.emplace_back(bytes.data() + b, c - b);
    b = c;
  }
  out.emplace_back(bytes.data() + b, bytes.size() - b);
  return out;
}

pb::StreamBatchesResponse Sample(std::string data) {
  pb::StreamBatchesResponse m;
  pb::BatchHeader* h = m.mutable_header();
  h->mutable_cursor()->set_epoch(3);
  h->mutable_cursor()->set_step(4);
  h->set_payload_bytes(1 << 20);
  pb::TensorHeader* t = h->add_tensors();
  t->set_name("cam0");
  t->set_dtype(pb::UINT8);
  t->add_shape(16);
  t->set_bytes(16);
  m.set_offset(12345);
  m.set_data(std::move(data));
  m.set_last(true);
  return m;
}

TEST(ClientWireTest, MatchesProtobufAtEverySliceBoundary) {
  std::mt19937 rng(1);
  std::string data(100000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const std::string bytes = Sample(data).SerializeAsString();
  std::vector<std::vector<size_t>> patterns = {{}};
  for (size_t i = 1; i < 80; ++i) patterns.push_back({i});  // through the header and data tag
  std::vector<size_t> every;
  for (size_t i = 1; i < bytes.size(); i += 997) every.push_back(i);
  patterns.push_back(every);
  for (const auto& cuts : patterns) {
    const std::vector<grpc::Slice> slices = Cut(bytes, cuts);
    Message m;
    ASSERT_TRUE(ParseMessage(&slices, &m));
    ASSERT_TRUE(m.header.has_value());
    EXPECT_EQ(m.header->SerializeAsString(), Sample(data).header().SerializeAsString());
    EXPECT_FALSE(m.start.has_value());
    EXPECT_EQ(m.offset, 12345u);
    EXPECT_TRUE(m.last);
    ASSERT_EQ(m.data_size, data.size());
    std::string got(data.size(), '\0');
    ASSERT_TRUE(m.data_at->Copy(reinterpret_cast<uint8_t*>(got.data()), got.size()));
    EXPECT_EQ(got, data);
  }
}

TEST(ClientWireTest, StartMessageAndUnknownFieldsAreSkipped) {
  pb::StreamBatchesResponse m;
  m.mutable_start()->set_protocol_version(1);
  m.mutable_start()->set_dataset_fingerprint("abc");
  std::string bytes = m.SerializeAsString();
  // Field 99 (varint), field 100 (bytes), field 101 (fixed32), field 102 (fixed64): a newer server.
  bytes += std::string("\x98\x06\x07", 3) + std::string("\xa2\x06\x03xyz", 6) +
           std::string("\xad\x06\x01\x02\x03\x04", 6) + std::string("\xb1\x06", 2) + std::string(8, '\x01');
  const std::vector<grpc::Slice> slices = Cut(bytes, {});
  Message out;
  ASSERT_TRUE(ParseMessage(&slices, &out));
  ASSERT_TRUE(out.start.has_value());
  EXPECT_EQ(out.start->dataset_fingerprint(), "abc");
  EXPECT_FALSE(out.header.has_value());
  EXPECT_FALSE(out.data_at.has_value());
}

TEST(ClientWireTest, TruncatedAndMalformedInputIsRefused) {
  const std::string bytes = Sample(std::string(5000, 'x')).SerializeAsString();
  int accepted = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<grpc::Slice> slices = Cut(bytes.substr(0, n), {n / 2});
    Message m;
    if (!ParseMessage(&slices, &m)) continue;
    ++accepted;  // cut at a field boundary: what is there is whole
    if (m.data_at) {
      std::string got(m.data_size, '\0');
      EXPECT_TRUE(m.data_at->Copy(reinterpret_cast<uint8_t*>(got.data()), got.size()));
    }
  }
  EXPECT_LT(accepted, 10);  // only the few prefixes that end between fields
  for (const std::string& bad : {std::string("\x0b", 1),                 // wire type 3 (group)
                                 std::string("\x22\xff\xff\xff\xff\x0f", 6),  // 4 GiB of data
                                 std::string("\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
                                 std::string("\x12\x02\xff\xff", 4)}) {  // a header that does not parse
    const std::vector<grpc::Slice> slices = Cut(bad, {});
    Message m;
    EXPECT_FALSE(ParseMessage(&slices, &m)) << testing::PrintToString(bad);
  }
}

TEST(ClientWireTest, TensorHeadersFromAnUntrustedServerAreChecked) {
  auto tensor = [](std::vector<int64_t> shape, v1::DType dtype, uint64_t offset, uint64_t bytes) {
    v1::TensorHeader t;
    t.set_name("t");
    t.set_dtype(dtype);
    for (int64_t d : shape) t.add_shape(d);
    t.set_offset(offset);
    t.set_bytes(bytes);
    return t;
  };
  EXPECT_EQ(CheckTensor(tensor({2, 3}, v1::FLOAT32, 64, 24), 128), std::nullopt);
  EXPECT_EQ(CheckTensor(tensor({}, v1::UINT8, 0, 1), 1), std::nullopt);  // a scalar
  // 2^32 x 2^32 x 4 bytes wraps to 0 modulo 2^64: the old check accepted it with bytes = 0.
  EXPECT_NE(CheckTensor(tensor({1ll << 32, 1ll << 32}, v1::FLOAT32, 0, 0), 128), std::nullopt);
  EXPECT_NE(CheckTensor(tensor({-1, 4}, v1::UINT8, 0, 4), 128), std::nullopt);
  EXPECT_NE(CheckTensor(tensor({2, 3}, v1::FLOAT32, 120, 24), 128), std::nullopt);  // past the end
  EXPECT_NE(CheckTensor(tensor({1}, v1::UINT8, ~uint64_t{0}, 2), 128), std::nullopt);  // wraps
  EXPECT_NE(CheckTensor(tensor(std::vector<int64_t>(33, 1), v1::UINT8, 0, 1), 128), std::nullopt);
  EXPECT_NE(CheckTensor(tensor({5}, v1::INT32, 0, 5), 128), std::nullopt);  // 5 int32s are 20 bytes
}

}  // namespace
}  // namespace conveyor::client::wire
