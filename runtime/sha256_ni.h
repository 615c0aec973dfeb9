// SHA-256 on the x86 SHA extensions, for runtime/sha256.cpp (internal: use Sha256).
#pragma once

#include <cstddef>
#include <cstdint>

namespace xserv::runtime::detail {

/// Whether this CPU has the SHA extensions (and SSSE3 / SSE4.1, which the code also uses).
bool cpu_has_sha_ni();

/// Compresses `blocks` 64-byte blocks at `data` into `state` (a, b, ..., h) with round constants
/// `k`; only when cpu_has_sha_ni().
void sha256_ni_blocks(uint32_t state[8], const uint8_t* data, size_t blocks, const uint32_t k[64]);

} // namespace xserv::runtime::detail
