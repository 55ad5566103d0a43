// SHA-256 of bytes as lowercase hex (OpenSSL's libcrypto): the digests a config and its files
// are pinned by (the server's config digest, a tokenizer model's bytes).
#pragma once

#include <string>
#include <string_view>

namespace conveyor {

std::string Sha256Hex(std::string_view data);

}  // namespace conveyor
