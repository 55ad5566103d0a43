#include "tools/batch_line.h"

#include <openssl/evp.h>

#include <memory>

#include "base/strings.h"
#include "format/format.h"

namespace conveyor::tools {
namespace {

std::string Hex(const unsigned char* d, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kHex[d[i] >> 4]);
    s.push_back(kHex[d[i] & 15]);
  }
  return s;
}

absl::StatusOr<std::string> Digest(std::span<const LineTensor> tensors) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("OpenSSL: cannot start a SHA-256 digest");
  }
  for (const LineTensor& t : tensors) {
    std::string head = StrCat(t.desc->name, "|", DTypeName(t.desc->dtype), "|");
    for (int64_t d : t.desc->shape) StrAppend(&head, d, ",");
    EVP_DigestUpdate(ctx.get(), head.data(), head.size());
    EVP_DigestUpdate(ctx.get(), t.data, t.bytes);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  return Hex(md, len);
}

}  // namespace

absl::StatusOr<std::string> BatchLine(uint64_t epoch, uint64_t step, uint32_t consumer,
                                      uint32_t consumers, std::span<const LineSample> ids,
                                      std::span<const LineTensor> tensors, bool digest,
                                      bool list_ids) {
  std::string bytes;
  for (const LineSample& id : ids) {
    if (id.dataset != 0) StrAppend(&bytes, id.dataset, ":");
    StrAppend(&bytes, id.index, ",");
  }
  std::string line = StrCat(epoch, ":", step, " consumer ", consumer, "/", consumers, " samples ",
                            ids.size(), " ids ", format::ChecksumHex(format::Checksum(bytes)));
  if (digest) {
    absl::StatusOr<std::string> d = Digest(tensors);
    if (!d.ok()) return d.status();
    StrAppend(&line, " sha256 ", *d);
  }
  if (list_ids) {
    StrAppend(&line, " [");
    for (size_t k = 0; k < ids.size(); ++k) {
      StrAppend(&line, k ? " " : "");
      if (ids[k].dataset != 0) StrAppend(&line, ids[k].dataset, ":");
      StrAppend(&line, ids[k].episode, "/", ids[k].step);
    }
    StrAppend(&line, "]");
  }
  return line;
}

}  // namespace conveyor::tools
