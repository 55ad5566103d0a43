// The carrier tables of both sides (server/internal/carrier.h, client/internal/carrier.h): which
// carrier a request gets and what the stream start says, the client's sources made from it in
// order with the messages last, and the messages' source placing a batch's payload or refusing
// what a server cannot truthfully send. Real gRPC streams through each carrier are in
// shm_transport_test and server_e2e_test.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/block_pool.h"
#include "client/internal/carrier.h"
#include "client/internal/message_source.h"
#include "server/internal/carrier.h"

namespace conveyor {
namespace {

namespace pb = ::conveyor::v1;

// A server whose stripe pool has `room` calls, counting what was reserved and returned.
struct StripePool {
  uint32_t room = 8, reserved = 0, returned = 0;
  CarrierServer server;
  explicit StripePool(bool shared_memory) {
    server.shared_memory = shared_memory;
    server.reserve_stripes = [this](uint32_t wanted) {
      const uint32_t k = room < 2 ? 0 : std::min(wanted, room);
      reserved += k;
      return k;
    };
    server.release_stripes = [this](uint32_t k) { returned += k; };
  }
};

CarrierRequest RequestFor(const pb::StreamBatchesRequest& req) {
  CarrierRequest r;
  r.request = &req;
  r.who = "job=test consumer=0/1";
  r.max_message = 1 << 16;
  r.batch_bytes = 1 << 20;
  r.queue_bytes = 64 << 20;
  r.reserve_memory = [](uint64_t) { return true; };
  return r;
}

TEST(ServerCarrierTest, NoneAskedMeansMessages) {
  StripePool pool(true);
  pb::StreamBatchesRequest req;
  pb::StreamStart start;
  EXPECT_EQ(GrantCarrier(RequestFor(req), pool.server, &start), nullptr);
  EXPECT_FALSE(start.shared_memory());
  EXPECT_EQ(start.payload_streams(), 0u);
  EXPECT_EQ(pool.reserved, 0u);
}

TEST(ServerCarrierTest, RefusedRegionSaysWhyAndStripesHaveTheirTurn) {
  StripePool pool(/*shared_memory=*/false);
  pb::StreamBatchesRequest req;
  req.mutable_shared_memory()->set_server_region(true);
  req.mutable_shared_memory()->set_capacity(1 << 20);
  req.set_payload_streams(3);
  pb::StreamStart start;
  {
    std::unique_ptr<CarrierGrant> grant = GrantCarrier(RequestFor(req), pool.server, &start);
    ASSERT_NE(grant, nullptr);
    EXPECT_FALSE(start.shared_memory());
    EXPECT_NE(start.shared_memory_refused().find("--shared-memory=false"), std::string::npos)
        << start.shared_memory_refused();
    EXPECT_EQ(start.payload_streams(), 3u);
    EXPECT_FALSE(start.stripe_token().empty());
    EXPECT_NE(pool.server.stripes.Find(start.stripe_token()), nullptr);
    EXPECT_EQ(pool.reserved, 3u);
  }
  // The grant ended before any stripe joined: its calls go back and its token is forgotten.
  EXPECT_EQ(pool.returned, 3u);
  EXPECT_EQ(pool.server.stripes.Find(start.stripe_token()), nullptr);
}

TEST(ServerCarrierTest, StripesAsManyAsThePoolHasAndNoneBelowTwo) {
  StripePool pool(true);
  pb::StreamBatchesRequest req;
  req.set_payload_streams(20);  // more than kMaxPayloadStreams
  pb::StreamStart start;
  std::unique_ptr<CarrierGrant> grant = GrantCarrier(RequestFor(req), pool.server, &start);
  ASSERT_NE(grant, nullptr);
  EXPECT_EQ(start.payload_streams(), kMaxPayloadStreams);

  pool.room = 1;
  pb::StreamStart none;
  EXPECT_EQ(GrantCarrier(RequestFor(req), pool.server, &none), nullptr);
  EXPECT_EQ(none.payload_streams(), 0u);
}

TEST(ServerCarrierTest, RegionForAnotherHostIsRefusedSayingWhy) {
  StripePool pool(true);
  pb::StreamBatchesRequest req;
  req.mutable_shared_memory()->set_server_region(true);
  req.mutable_shared_memory()->set_host("another host");
  pb::StreamStart start;
  EXPECT_EQ(GrantCarrier(RequestFor(req), pool.server, &start), nullptr);
  EXPECT_NE(start.shared_memory_refused().find("another host"), std::string::npos) << start.shared_memory_refused();
}

namespace wire = client::wire;

// A message of the stream, as the client's parser sees it.
struct Parsed {
  std::string bytes;
  std::vector<grpc::Slice> slices;
  wire::Message m;
  explicit Parsed(const pb::StreamBatchesResponse& r) : bytes(r.SerializeAsString()) {
    slices.emplace_back(bytes.data(), bytes.size());
    EXPECT_TRUE(wire::ParseMessage(&slices, &m));
  }
};

class MessageSourceTest : public ::testing::Test {
 protected:
  MessageSourceTest()
      : pool_(std::make_shared<BlockPool>(2, SIZE_MAX, 0, client::FreeBlock)),
        source_("127.0.0.1:1", [this](uint64_t bytes) -> absl::StatusOr<std::shared_ptr<client::BatchStorage>> {
          auto s = std::make_shared<client::BatchStorage>();
          s->pool = pool_;
          s->block = client::TakeBlock(*pool_, bytes, -1);
          return s;
        }) {}

  static pb::StreamBatchesResponse Part(bool header, uint64_t offset, std::string data, bool last) {
    pb::StreamBatchesResponse r;
    if (header) r.mutable_header()->set_payload_bytes(8);
    r.set_offset(offset);
    r.set_data(std::move(data));
    r.set_last(last);
    return r;
  }

  std::shared_ptr<BlockPool> pool_;
  client::MessageSource source_;
};

TEST_F(MessageSourceTest, PlacesPayloadAtItsOffsets) {
  client::InboundPayload p;
  p.bytes = 8;
  Parsed first(Part(true, 0, "abcd", false));
  ASSERT_TRUE(source_.Carries(first.m));
  ASSERT_TRUE(source_.Take(first.m, &p).ok());
  Parsed second(Part(false, 4, "efgh", true));
  ASSERT_TRUE(source_.Take(second.m, &p).ok());
  EXPECT_EQ(p.filled, 8u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(p.storage->data()), 8), "abcdefgh");
}

TEST_F(MessageSourceTest, RefusesGapsOverrunsAndPayloadsItDoesNotCarry) {
  client::InboundPayload p;
  p.bytes = 8;
  Parsed first(Part(true, 0, "abcd", false));
  ASSERT_TRUE(source_.Take(first.m, &p).ok());
  Parsed gap(Part(false, 5, "efg", true));
  EXPECT_EQ(source_.Take(gap.m, &p).code(), absl::StatusCode::kDataLoss);
  Parsed overrun(Part(false, 4, "efghi", true));
  EXPECT_EQ(source_.Take(overrun.m, &p).code(), absl::StatusCode::kDataLoss);

  pb::StreamBatchesResponse region;
  region.mutable_header()->set_payload_bytes(8);
  region.set_in_shared_memory(true);
  region.set_last(true);
  Parsed elsewhere(region);
  client::InboundPayload q;
  q.bytes = 8;
  absl::Status st = source_.Take(elsewhere.m, &q);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("127.0.0.1:1"), std::string_view::npos) << st;
}

TEST(ClientCarrierTest, OffersWhatTheOptionsAskAndMessagesComeLast) {
  client::ClientOptions o;
  o.shared_memory = false;
  o.payload_streams = 1;
  pb::StreamBatchesRequest req;
  std::string refused;
  EXPECT_TRUE(client::OfferCarriers(o, &req, &refused).empty());
  EXPECT_FALSE(req.has_shared_memory());
  EXPECT_EQ(req.payload_streams(), 0u);

  o.payload_streams = 4;
  std::vector<const client::Carrier*> offered = client::OfferCarriers(o, &req, &refused);
  ASSERT_EQ(offered.size(), 1u);
  EXPECT_EQ(req.payload_streams(), 4u);

  client::CarrierStream stream;
  stream.options = &o;
  stream.target = "127.0.0.1:1";
  pb::StreamStart start;  // nothing granted
  auto sources = client::AcceptCarriers(offered, stream, start, &refused);
  ASSERT_TRUE(sources.ok()) << sources.status();
  ASSERT_EQ(sources->size(), 1u);
  EXPECT_EQ(sources->back()->transport(), "grpc");

  start.set_payload_streams(5);  // more than asked for: a grant that cannot be true
  start.set_stripe_token("t");
  EXPECT_EQ(client::AcceptCarriers(offered, stream, start, &refused).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace conveyor
