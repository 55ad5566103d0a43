// The carriers a stream's payloads may travel by (server/internal/carrier.h), asked in order:
// the same-host region first (no payload byte crosses a socket), then stripes (several
// connections), then messages on the stream itself. A new carrier is one row here.
#include "server/internal/carrier.h"
#include "server/internal/shm_sink.h"
#include "server/internal/stripes.h"

namespace conveyor {
namespace {

constexpr Carrier kCarriers[] = {
    {AsksSharedMemory, GrantSharedMemory},  // server/shm_sink.cc
    {AsksStripes, GrantStripes},            // server/stripes.cc
};

}  // namespace

std::unique_ptr<CarrierGrant> GrantCarrier(const CarrierRequest& request, CarrierServer& server,
                                           v1::StreamStart* start) {
  for (const Carrier& c : kCarriers) {
    if (!c.asked(*request.request)) continue;
    if (std::unique_ptr<CarrierGrant> grant = c.grant(request, server, start)) return grant;
  }
  return nullptr;
}

}  // namespace conveyor
