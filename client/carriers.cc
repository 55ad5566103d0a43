// The carriers a stream may offer (client/internal/carrier.h), in the server's order
// (server/carriers.cc): the same-host region, then stripes; every stream also has its messages.
// A new carrier is one row here.
#include "client/internal/carrier.h"

#include "base/status_macros.h"
#include "client/internal/message_source.h"
#include "client/internal/shm_region.h"
#include "client/internal/stripes.h"

namespace conveyor::client {
namespace {

constexpr Carrier kCarriers[] = {
    {OfferSharedMemory, AcceptSharedMemory},  // client/shm_region.cc
    {OfferStripes, AcceptStripes},            // client/stripes.cc
};

}  // namespace

std::vector<const Carrier*> OfferCarriers(const ClientOptions& o, v1::StreamBatchesRequest* request,
                                          std::string* refused) {
  std::vector<const Carrier*> offered;
  for (const Carrier& c : kCarriers) {
    if (c.offer(o, request, refused)) offered.push_back(&c);
  }
  return offered;
}

absl::StatusOr<std::vector<std::shared_ptr<PayloadSource>>> AcceptCarriers(
    const std::vector<const Carrier*>& offered, const CarrierStream& stream, const v1::StreamStart& start,
    std::string* refused) {
  std::vector<std::shared_ptr<PayloadSource>> sources;
  for (const Carrier* c : offered) {
    ASSIGN_OR_RETURN(std::shared_ptr<PayloadSource> source, c->accept(stream, start, refused));
    if (source) {
      sources.push_back(std::move(source));
      break;
    }
  }
  sources.push_back(std::make_shared<MessageSource>(stream.target, stream.allocate));
  return sources;
}

}  // namespace conveyor::client
