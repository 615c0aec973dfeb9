// SHA-256's compression function on the x86 SHA extensions (SHA-NI: sha256rnds2, sha256msg1/2),
// used by runtime/sha256.cpp when the CPU has them: about ten times the portable code, which is
// what makes a full hash of a checkpoint (--verify-weights, compile) affordable.
#include "runtime/sha256_ni.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace xserv::runtime::detail {

#if defined(__x86_64__) || defined(__i386__)

bool cpu_has_sha_ni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return false;
  const bool ssse3 = c & (1u << 9), sse41 = c & (1u << 19);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
    return false;
  return ssse3 && sse41 && (b & (1u << 29)); // leaf 7 EBX bit 29: SHA
}

// The state is kept as ABEF and CDGH, the order sha256rnds2 takes; each group of four rounds
// adds its constants to four schedule words, and the schedule for group g + 1 is made while
// group g runs (msg1 over the previous two groups, msg2 with the latest), as Intel's reference
// code for the instructions does.
__attribute__((target("sha,sse4.1,ssse3"))) void
sha256_ni_blocks(uint32_t state[8], const uint8_t* data, size_t blocks, const uint32_t k[64]) {
  const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));
  __m128i s1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));
  tmp = _mm_shuffle_epi32(tmp, 0xB1);       // CDAB
  s1 = _mm_shuffle_epi32(s1, 0x1B);         // EFGH
  __m128i s0 = _mm_alignr_epi8(tmp, s1, 8); // ABEF
  s1 = _mm_blend_epi16(s1, tmp, 0xF0);      // CDGH
  for (; blocks > 0; --blocks, data += 64) {
    const __m128i abef = s0, cdgh = s1;
    __m128i w[4];
    for (int i = 0; i < 4; ++i)
      w[i] =
          _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * i)), swap);
    for (int g = 0; g < 16; ++g) {
      __m128i msg =
          _mm_add_epi32(w[g % 4], _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 4 * g)));
      s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
      if (g >= 3 && g < 15) { // the words of group g + 1
        __m128i& next = w[(g + 1) % 4];
        next = _mm_add_epi32(next, _mm_alignr_epi8(w[g % 4], w[(g + 3) % 4], 4));
        next = _mm_sha256msg2_epu32(next, w[g % 4]);
      }
      msg = _mm_shuffle_epi32(msg, 0x0E);
      s0 = _mm_sha256rnds2_epu32(s0, s1, msg);
      if (g >= 1 && g < 13) // the first half of the words of group g + 3
        w[(g + 3) % 4] = _mm_sha256msg1_epu32(w[(g + 3) % 4], w[g % 4]);
    }
    s0 = _mm_add_epi32(s0, abef);
    s1 = _mm_add_epi32(s1, cdgh);
  }
  tmp = _mm_shuffle_epi32(s0, 0x1B);   // FEBA
  s1 = _mm_shuffle_epi32(s1, 0xB1);    // DCHG
  s0 = _mm_blend_epi16(tmp, s1, 0xF0); // DCBA
  s1 = _mm_alignr_epi8(s1, tmp, 8);    // ABEF
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), s0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), s1);
}

#else

bool cpu_has_sha_ni() {
  return false;
}

void sha256_ni_blocks(uint32_t*, const uint8_t*, size_t, const uint32_t*) {}

#endif

} // namespace xserv::runtime::detail
