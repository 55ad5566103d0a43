// Fuzzes the client's hand-written parser of stream messages (client/internal/wire.h): any bytes, cut into
// slices at fuzzer-chosen points, must parse or be refused, never read out of bounds; tensor
// headers (shapes, offsets, byte counts) must be checked or refused without overflow.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "client/internal/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t step = 1 + data[0] % 64;  // slice length
  std::vector<grpc::Slice> slices;
  for (size_t b = 1; b < size; b += step) {
    slices.emplace_back(data + b, std::min(step, size - b));
  }
  conveyor::client::wire::Message m;
  if (conveyor::client::wire::ParseMessage(&slices, &m) && m.data_at && m.data_size <= (1u << 20)) {
    std::string out(m.data_size, '\0');
    if (!m.data_at->Copy(reinterpret_cast<uint8_t*>(out.data()), out.size())) __builtin_trap();
  }
  // Tensor headers as the server sends them: shapes and offsets checked without overflow.
  if (m.header) {
    for (const auto& t : m.header->tensors()) {
      const bool bad = conveyor::client::wire::CheckTensor(t, m.header->payload_bytes()).has_value();
      if (!bad && (t.offset() + t.bytes() > m.header->payload_bytes())) __builtin_trap();
    }
  }
  return 0;
}
