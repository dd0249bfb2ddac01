// The decoder layers of a q4 (4-bit weight, bf16 activation) forward over at most a verify round's positions, as one
// native call: core/runtime/native.py builds it, core/runtime/lean.py calls it. Python used to dispatch ~55 small ops a layer here,
// which cost more than the weights themselves; this does the norms, rotary embedding, cache writes, attention and
// activations in plain loops, and the products from 4-bit codes (q4_mm below).
//
// Batch invariance by construction: every value a row computes (norms, scores, softmax, weighted sums) is the same
// sequence of float operations whether the row is fed alone, in a chain or in a tree. Reductions over a row's keys
// run over its visible keys in the order of their position in the sequence they belong to (the cached context, then
// the fed ancestors by depth), which is where they sit after those tokens are accepted; lanes are assigned by that
// index, never by where a key happens to lie in the cache or a tile. Built with -ffp-contract=off, so a product and
// a sum fuse only where written (fma below).
//
// Shape letters: T = fed positions, E = hidden size, H = query heads, G = key/value heads, R = H / G, D = head dim,
// S = cache capacity, P = cached positions before this forward, I = MLP width, C = compact (visible) keys of a row.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "products.h"
#include "simd.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

using namespace simd;
using namespace products;

// up to 16 dot products for each of HEADS heads: out[j][k] = sum of the lanes of part(k)'s j-th V16, head j's lane-wise
// products with key k, the lanes reduced by one tree (lane i + lane i + 8, then + 4, + 2, + 1, which is how
// _mm512_reduce_add_ps and the portable sum() reduce), here for 16 keys at once by shuffles, not one by one. part(k,
// parts) writes the HEADS products of key k, so heads that share a key read it once
template <int HEADS, typename Part>
inline void dots(int64_t count, Part part, float* const* out) {
#if defined(__AVX512F__)
  __m512 acc[HEADS][LANES];
  for (int64_t k = 0; k < LANES; ++k) {
    V16 parts[HEADS];
    if (k < count) part(k, parts);
    for (int j = 0; j < HEADS; ++j) acc[j][k] = k < count ? parts[j].v : _mm512_setzero_ps();
  }
  for (int h = 0; h < HEADS; ++h) {
    __m512 halves[8], quarters[4], eighths[2];
    for (int j = 0; j < 8; ++j)  // keys 2j, 2j + 1: lane i + lane i + 8, i < 8
      halves[j] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[h][2 * j], acc[h][2 * j + 1], 0x44),
                                _mm512_shuffle_f32x4(acc[h][2 * j], acc[h][2 * j + 1], 0xEE));
    for (int j = 0; j < 4; ++j)  // keys 4j .. 4j + 3, one a 128-bit lane: + 4
      quarters[j] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * j], halves[2 * j + 1], 0x88),
                                  _mm512_shuffle_f32x4(halves[2 * j], halves[2 * j + 1], 0xDD));
    for (int j = 0; j < 2; ++j)  // lane l of 128 bits: keys l + 8j, l + 4 + 8j: + 2
      eighths[j] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * j], quarters[2 * j + 1], 0x44),
                                 _mm512_shuffle_ps(quarters[2 * j], quarters[2 * j + 1], 0xEE));
    // + 1: element 4l + m holds key 4m + l
    const __m512 mixed = _mm512_add_ps(_mm512_shuffle_ps(eighths[0], eighths[1], 0x88),
                                       _mm512_shuffle_ps(eighths[0], eighths[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_mask_storeu_ps(out[h], first(count), _mm512_permutexvar_ps(order, mixed));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  for (int64_t k0 = 0; k0 < count; k0 += 8) {  // eight keys at a time, each reduced by sum()'s tree
    __m256 eight[HEADS][8];  // head h, key k0 + k: lane i + lane i + 8
    for (int64_t k = 0; k < 8; ++k) {
      if (k0 + k >= count) {
        for (int h = 0; h < HEADS; ++h) eight[h][k] = _mm256_setzero_ps();
        continue;
      }
      V16 parts[HEADS];
      part(k0 + k, parts);
      for (int h = 0; h < HEADS; ++h) eight[h][k] = _mm256_add_ps(parts[h].lo, parts[h].hi);
    }
    for (int h = 0; h < HEADS; ++h) {
      __m256 fours[4], twos[2];
      for (int j = 0; j < 4; ++j)  // keys 2j, 2j + 1 in the low and high 128 bits: + 4
        fours[j] = _mm256_add_ps(_mm256_permute2f128_ps(eight[h][2 * j], eight[h][2 * j + 1], 0x20),
                                 _mm256_permute2f128_ps(eight[h][2 * j], eight[h][2 * j + 1], 0x31));
      for (int j = 0; j < 2; ++j)  // + 2: low 128 bits keys 4j, 4j + 2; high keys 4j + 1, 4j + 3
        twos[j] = _mm256_add_ps(_mm256_shuffle_ps(fours[2 * j], fours[2 * j + 1], 0x44),
                                _mm256_shuffle_ps(fours[2 * j], fours[2 * j + 1], 0xEE));
      // + 1: keys 0, 2, 4, 6 in the low 128 bits, 1, 3, 5, 7 in the high
      const __m256 mixed = _mm256_add_ps(_mm256_shuffle_ps(twos[0], twos[1], 0x88),
                                         _mm256_shuffle_ps(twos[0], twos[1], 0xDD));
      const __m256 ordered = _mm256_permutevar8x32_ps(mixed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_maskstore_ps(out[h] + k0, half_mask(count - k0), ordered);
    }
  }
#else
  for (int64_t k = 0; k < count; ++k) {
    V16 parts[HEADS];
    part(k, parts);
    for (int h = 0; h < HEADS; ++h) out[h][k] = sum(parts[h]);
  }
#endif
}

// RMSNorm of one row x (n,) fp32 -> out (n,) fp32 = x / sqrt(mean(x^2) + eps) * weight
inline void rms_norm_row(const float* x, const bf16* weight, int64_t n, double eps, float* out) {
  const V16 inv = splat(1.0f / std::sqrt(lane_sum(x, n, true) / static_cast<float>(n) + static_cast<float>(eps)));
  for (int64_t i = 0; i < n; i += LANES) store(out + i, load(x + i, n - i) * inv * load(weight + i, n - i), n - i);
}

// residual (T, E) fp32 -> normalised rows (T, E) bf16, the int4 kernel's input
at::Tensor rms_norm(const at::Tensor& residual, const at::Tensor& weight, double eps) {
  const int64_t rows = residual.size(0), width = residual.size(1);
  auto out = at::empty({rows, width}, residual.options().dtype(at::kBFloat16));
  std::vector<float> row(width);
  for (int64_t t = 0; t < rows; ++t) {
    rms_norm_row(residual.data_ptr<float>() + t * width, weight.data_ptr<bf16>(), width, eps, row.data());
    bf16* dst = out.data_ptr<bf16>() + t * width;
    for (int64_t i = 0; i < width; i += LANES) store(dst + i, load(row.data() + i, width - i), width - i);
  }
  return out;
}

// ---- products from 4-bit and 8-bit codes ---------------------------------------------------------------------------
// The weights of a linear layer (O, I) as blocks of 16 outputs x 32 inputs. q4 (core.runtime.cpu_linear.pack_q4_blocks): per
// block 64 int32 words of codes, then 16 fp16 scales and 16 fp16 minimums, w = code * scale + minimum. Word (q, j)
// holds output j's codes for inputs 8q .. 8q + 7: input 8q + 2k in bits 4k .. 4k + 3, input 8q + 2k + 1 in bits
// 16 + 4k .. 19 + 4k, so (word >> 4k) & 0x000F000F is the code pair of inputs 2p, 2p + 1 (p = 4q + k) as two 16-bit
// halves, the operand layout of a bf16 pair dot product. q8 (pack_q8_blocks, GGUF's Q8_0 scheme): per block 128 words
// of signed 8-bit codes, 8 words per input pair p (output j's codes of inputs 2p, 2p + 1 in bytes 2j, 2j + 1), then 16
// fp16 scales, w = code * scale. That is the "pairs" layout; the integer products read the "bytes" one (below).
//
// Per block, a row's product is scale * sum_i x_i code_i (+ minimum * sum_i x_i): the codes are whole numbers below
// 256, exact in bf16, so the sum over the block's inputs runs on bf16 pair dot products (AVX512-BF16: 32 products an
// instruction) and each block's codes are unpacked once for every row fed, where torch's int4 kernel paid the
// unpacking again for each row. Batch invariance by construction: each row's value is the same sequence of
// operations whatever the other rows are; rows are taken a few at a time (Kind::ROWS) only to share the unpacking.
// partial sums a row keeps per block: short chains of dependent products (one row's sixteen products in one chain
// waited on each other), four where the registers hold 32 vectors (AVX-512), two where they hold 8 (the plain-array
// build). The same for every row count: how a row's sum is associated must not depend on it
constexpr int PARTIALS = REGISTERS >= 32 ? 4 : 2;

// sum of x[0..31] (bf16) in fp32: two lane-wise halves, then the lanes in a fixed order
inline float group_sum(const bf16* x) { return sum(load(x) + load(x + LANES)); }

// the products' operands and steps (products.h chooses): bf16 pair dot products where the CPU has AVX512-BF16; integer
// products on 8-bit codes with AVX2 (a CPU with AVX-512 but no BF16 included); else fp32 products in the pair
// instruction's order (input 2p + 1, then 2p)
#if defined(BF16_PRODUCTS)
using Pairs = __m512bh;  // 16 lanes of two bf16 codes
using Operand = bf16;  // the rows as the pair step reads them
constexpr const char* LAYOUT = "pairs";  // the codes' arrangement in a block (core.runtime.cpu_linear.pack_q4_blocks)
constexpr const char* Q8_LAYOUT = "pairs";  // and in a q8 block (pack_q8_blocks)
constexpr const char* ACTIVATIONS = "bf16";
inline const Operand* prepare_rows(const bf16* x, int64_t, int64_t, std::vector<Operand>&) { return x; }
inline V16 pair_step(V16 acc, Pairs codes, const bf16* x) {  // acc + codes . (x[0], x[1]) lane by lane
  int32_t both;
  std::memcpy(&both, x, sizeof(both));  // the two inputs as one bf16 pair
  return {_mm512_dpbf16_ps(acc.v, codes, (__m512bh)_mm512_set1_epi32(both))};
}

inline Pairs q4_pairs(const int32_t* words, int k) {  // inputs 8q + 2k, + 1 of each output, q from `words`
  alignas(64) static const uint16_t table[32] = {  // bf16 of 0 .. 15, twice
      0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150,
      0x4160, 0x4170, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130,
      0x4140, 0x4150, 0x4160, 0x4170};
  const __m512i pair = _mm512_and_si512(_mm512_srli_epi32(_mm512_loadu_si512(words), 4 * k),
                                        _mm512_set1_epi32(0x000F000F));
  return (__m512bh)_mm512_permutexvar_epi16(pair, _mm512_load_si512(table));
}

inline Pairs q8_pairs(const int32_t* words) {  // 16 outputs' two signed 8-bit codes -> bf16 pairs
  const __m512i wide = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words)));  // 32 x i16
  const __m512 low = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(wide)));
  const __m512 high = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(wide, 1)));
  return _mm512_cvtne2ps_pbh(high, low);
}
#elif defined(INTEGER_PRODUCTS)
// 8-bit codes per block of 32 inputs with one scale (products.h: Operand, quantize_rows, q8_dots)
#if defined(VNNI_PRODUCTS)
constexpr const char* LAYOUT = "quads";
#else
constexpr const char* LAYOUT = "bytes";
#endif
constexpr const char* Q8_LAYOUT = "bytes";
constexpr const char* ACTIVATIONS = "8-bit";

inline const Operand* prepare_rows(const bf16* x, int64_t n, int64_t in, std::vector<Operand>& storage) {
  storage = quantize_rows(x, n, in);
  return storage.data();
}

#if defined(VNNI_PRODUCTS)
// q4, layout "quads": word 16j + l holds output l's codes of inputs 8j .. 8j + 3 (the low 4 bits of its bytes) and
// 8j + 4 .. 8j + 7 (the high ones), so each 64-byte load is two vpdpbusd operands of 16 outputs x 4 inputs, and a
// row's four inputs are one broadcast word. Two sums a row (the low and the high halves) halve the chain of dependent
// products; integer sums are exact, so how they are associated changes nothing
template <int R, int P>
inline void q4_dots(const int32_t* words, const Operand* const* x, V16* dot) {
  __m512i sum[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm512_setzero_si512();
  const __m512i low = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int j = 0; j < GROUP / 8; ++j) {
    const __m512i packed = _mm512_loadu_si512(words + 16 * j);
    const __m512i first = _mm512_and_si512(packed, low), second = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], first, _mm512_set1_epi32(products::four(x[r], 2 * j)));
      sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], second, _mm512_set1_epi32(products::four(x[r], 2 * j + 1)));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) dot[r] = products::scaled(_mm512_add_epi32(sum[r][0], sum[r][1]), x[r]);
}
#else
// q4, layout "bytes": byte 32m + 4l + i holds output l's code of input 4m + i (low 4 bits) and output 8 + l's (high).
// Per 16-bit lane, 8 steps of two products each: at most 8 * 2 * 15 * 127 = 30,480, so the sums stay 16-bit
template <int R, int P>
inline void q4_dots(const int32_t* words, const Operand* const* x, V16* dot) {
  __m256i part[R][2];  // outputs 0..7 and 8..15: 16-bit sums, two per output
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) part[r][0] = part[r][1] = _mm256_setzero_si256();
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int m = 0; m < GROUP / 4; ++m) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 8 * m));
    const __m256i first = _mm256_and_si256(packed, low), second = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i inputs = four_codes(x[r], m);
      part[r][0] = _mm256_add_epi16(part[r][0], _mm256_maddubs_epi16(first, inputs));
      part[r][1] = _mm256_add_epi16(part[r][1], _mm256_maddubs_epi16(second, inputs));
    }
  }
  const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256i sums[2] = {_mm256_madd_epi16(part[r][0], ones), _mm256_madd_epi16(part[r][1], ones)};
    dot[r] = scaled(sums, x[r]);
  }
}
#endif  // VNNI_PRODUCTS

// q8: products.h's q8_dots (P: the pair builds' partial sums; the integer sums are exact and need none)
template <int R, int P>
inline void q8_dots(const int32_t* words, const Operand* const* x, V16* dot) { products::q8_dots<R>(words, x, dot); }
#else
struct Pairs {
  V16 even, odd;
};
using Operand = float;  // the rows widened to fp32 once per product, not once per block and output tile
constexpr const char* LAYOUT = "pairs";
constexpr const char* Q8_LAYOUT = "pairs";
constexpr const char* ACTIVATIONS = "bf16";
inline const Operand* prepare_rows(const bf16* x, int64_t n, int64_t in, std::vector<Operand>& storage) {
  storage.resize(n * in);
  for (int64_t i = 0; i < n * in; i += LANES) store(storage.data() + i, load(x + i, n * in - i), n * in - i);
  return storage.data();
}
inline V16 pair_step(V16 acc, const Pairs& codes, const float* x) {
  acc = fma(codes.odd, splat(x[1]), acc);
  return fma(codes.even, splat(x[0]), acc);
}

inline Pairs q4_pairs(const int32_t* words, int k) {
  Pairs r;
  for (int l = 0; l < LANES; ++l) {
    const uint32_t word = static_cast<uint32_t>(words[l]);
    r.even.v[l] = static_cast<float>((word >> (4 * k)) & 15u);
    r.odd.v[l] = static_cast<float>((word >> (16 + 4 * k)) & 15u);
  }
  return r;
}

inline Pairs q8_pairs(const int32_t* words) {
  const int8_t* codes = reinterpret_cast<const int8_t*>(words);
  Pairs r;
  for (int l = 0; l < LANES; ++l) {
    r.even.v[l] = static_cast<float>(codes[2 * l]);
    r.odd.v[l] = static_cast<float>(codes[2 * l + 1]);
  }
  return r;
}
#endif

#if !defined(INTEGER_PRODUCTS)
// a row's partial sums added in a fixed order: (0 + 1) + (2 + 3), or 0 + 1
template <int P>
inline V16 combine(const V16* part) {
  if constexpr (P == 4) return (part[0] + part[1]) + (part[2] + part[3]);
  V16 total = part[0];
  for (int q = 1; q < P; ++q) total = total + part[q];
  return total;
}

// dot[r] (16 outputs) = sum over the block's 32 inputs of code * x[r]; quarter q of the inputs into partial q % P
template <int R, int P>
inline void q4_dots(const int32_t* words, const Operand* const* x, V16* dot) {
  V16 part[R][P];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < P; ++q) part[r][q] = zeros();
  for (int k = 0; k < 4; ++k)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const Pairs codes = q4_pairs(words + q * LANES, k);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) part[r][q % P] = pair_step(part[r][q % P], codes, x[r] + 8 * q + 2 * k);
    }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) dot[r] = combine<P>(part[r]);
}

// input pair p into partial p % P
template <int R, int P>
inline void q8_dots(const int32_t* words, const Operand* const* x, V16* dot) {
  V16 part[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < P; ++q) part[r][q] = zeros();
  for (int p = 0; p < GROUP / 2; p += P)
#pragma GCC unroll 4
    for (int q = 0; q < P; ++q) {  // input pair p + q into partial q
      const Pairs codes = q8_pairs(words + (p + q) * 8);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) part[r][q] = pair_step(part[r][q], codes, x[r] + 2 * (p + q));
    }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) dot[r] = combine<P>(part[r]);
}
#endif

// the integer path: rows as 8-bit codes per block (one Operand a block), else one Operand an input
#if defined(INTEGER_PRODUCTS)
constexpr bool INTEGER = true;
#else
constexpr bool INTEGER = false;
#endif
#if defined(VNNI_PRODUCTS)
constexpr bool VNNI = true;
#else
constexpr bool VNNI = false;
#endif
constexpr int64_t OPERANDS = INTEGER ? 1 : GROUP;  // Operands a block of inputs spans

// How many blocks ahead of the one being multiplied block_tile asks for the weight's cache lines. The hardware
// prefetcher alone left the forward waiting on memory: 2 blocks (~0.6-1 KB) ahead made forwards over 1, 2 and 5
// positions 2-4% faster and plain-decoding replies 0-2% faster on the AVX2 EPYC (Zen 3); 3 blocks did as well on the
// forwards, 8 made them 2-7% slower (scripts.prefetch_ab, docs/results/engine/prefetch-ab*-2026-12-03.json). On the
// AVX-512 EPYC (Zen 4) with the VNNI products, no prefetch did best: 2 blocks made forwards over 1 and 2 positions
// ~10% slower and plain-decoding replies ~7% slower (docs/results/engine/prefetch-ab-vnni-2026-12-04.json).
// Non-temporal: the weights are read once a forward and should not push the attention's keys and the Python between
// forwards out of the cache. A product's arithmetic is the same at any distance (0: none).
int64_t prefetch_blocks = VNNI ? 0 : 2;

void set_prefetch_blocks(int64_t blocks) {
  TORCH_CHECK(0 <= blocks && blocks <= 64, "prefetch distance must be 0..64 blocks, got ", blocks);
  prefetch_blocks = blocks;
}

inline void prefetch(const int32_t* words, int64_t count) {  // every cache line of `count` words from `words`
  const char* bytes = reinterpret_cast<const char*>(words);
  for (int64_t line = 0; line < count * static_cast<int64_t>(sizeof(int32_t)); line += 64)
    __builtin_prefetch(bytes + line, 0, 0);  // read, no temporal locality (x86: prefetchnta)
}

struct Q4Blocks {  // pack_q4_blocks: codes, scales, minimums
  static constexpr int64_t WORDS = 80, SCALES = 64, MINIMA = 72;
  // rows sharing one unpacking: their sums (R x PARTIALS vectors; R x 2 16-bit ones for the integer products), the
  // codes and the inputs fill the registers
  static constexpr int ROWS = VNNI ? 8 : INTEGER ? 4 : REGISTERS >= 32 ? 4 : 2;
  template <int R>
  static void dots(const int32_t* words, const Operand* const* x, V16* dot) { q4_dots<R, PARTIALS>(words, x, dot); }
};

struct Q8Blocks {  // pack_q8_blocks: codes, scales
  static constexpr int64_t WORDS = Q8_WORDS, SCALES = Q8_SCALES, MINIMA = -1;
  // 8 rows share one unpacking with 2 partial sums each (2 rows in the plain-array build; 4 rows for the integer
  // products): turning 8-bit codes into bf16 pairs costs ~5 instructions a pair of inputs, more than the 4-bit table
  // lookup, so it is shared by more rows
  static constexpr int ROWS = VNNI ? 8 : INTEGER ? 4 : REGISTERS >= 32 ? 8 : 2;
  template <int R>
  static void dots(const int32_t* words, const Operand* const* x, V16* dot) { q8_dots<R, 2>(words, x, dot); }
};

// rows r0 .. r0 + R of x (N, I) times the 16 outputs of tile `tile` -> out (N, O) bf16 or fp32 (+ bias, in fp32)
template <typename Kind, int R, typename Out>
void block_tile(const int32_t* blocks, const Operand* x, const float* sums, const bf16* bias, int64_t in, int64_t outs,
                int64_t tile, int64_t r0, Out* out) {
  const int64_t groups = in / GROUP;
  V16 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = zeros();
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t* block = blocks + (tile * groups + g) * Kind::WORDS;
    if (g + prefetch_blocks < groups) prefetch(block + prefetch_blocks * Kind::WORDS, Kind::WORDS);
    const Operand* at_group[R];
    V16 dot[R];
    for (int r = 0; r < R; ++r) at_group[r] = x + ((r0 + r) * groups + g) * OPERANDS;
    Kind::template dots<R>(block, at_group, dot);
    const V16 scale = load_half(block + Kind::SCALES);
    for (int r = 0; r < R; ++r) acc[r] = fma(scale, dot[r], acc[r]);
    if constexpr (Kind::MINIMA >= 0) {
      const V16 minimum = load_half(block + Kind::MINIMA);
      for (int r = 0; r < R; ++r) acc[r] = fma(minimum, splat(sums[(r0 + r) * groups + g]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    V16 result = acc[r];
    if (bias != nullptr) result = result + load(bias + tile * TILE);
    store(out + (r0 + r) * outs + tile * TILE, result);
  }
}

// Row t's inputs of block g summed as the code products see them, for the q4 minimums: with the integer products the
// 8-bit codes' sum times their scale (the minimum and the codes then multiply the same inputs, as in llama.cpp's Q4_1
// x Q8_1 product; the inputs' exact sum beside rounded code products had drifted further from the model, fewer greedy
// tokens agreeing with transformers in fp32, docs/journal/engine.md "Fidelity"), else the bf16 inputs' sum.
inline float block_sum(const Operand* rows, const bf16* x, int64_t t, int64_t in, int64_t g) {
#if defined(INTEGER_PRODUCTS)
  (void)x;
  const Operand& block = rows[t * (in / GROUP) + g];
  return block.scale * static_cast<float>(block.code_sum);
#else
  (void)rows;
  return group_sum(x + t * in + g * GROUP);
#endif
}

// x (N, I) bf16 times the packed blocks of an (O, I) weight -> (N, O) of Out (bf16, or fp32 for the LM head's logits)
template <typename Kind, typename Out = bf16>
at::Tensor blocks_mm(const at::Tensor& x, const at::Tensor& blocks, int64_t outs, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x must be (N, I) bf16");
  const int64_t n = x.size(0), in = x.size(1), groups = in / GROUP, tiles = outs / TILE;
  TORCH_CHECK(in % GROUP == 0 && outs % TILE == 0, "the weight must be whole blocks of 16 x 32");
  TORCH_CHECK(blocks.scalar_type() == at::kInt && blocks.is_contiguous() && blocks.numel() == tiles * groups * Kind::WORDS,
              "blocks must be core.runtime.cpu_linear's packed int32 tensor for this shape and kind");
  TORCH_CHECK(!bias.numel() || (bias.scalar_type() == at::kBFloat16 && bias.numel() == outs), "bias must be (O,) bf16");
  const bf16* xs = x.data_ptr<bf16>();
  std::vector<Operand> storage;
  const Operand* rows = prepare_rows(xs, n, in, storage);
  std::vector<float> sums;  // (N, I / 32): each row's inputs summed per block, for the minimums
  if constexpr (Kind::MINIMA >= 0) {
    sums.resize(n * groups);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t g = 0; g < groups; ++g) sums[t * groups + g] = block_sum(rows, xs, t, in, g);
  }
  constexpr bool FP32_OUT = std::is_same_v<Out, float>;
  auto out = at::empty({n, outs}, x.options().dtype(FP32_OUT ? at::kFloat : at::kBFloat16));
  const int32_t* words = blocks.data_ptr<int32_t>();
  const bf16* b = bias.numel() ? bias.data_ptr<bf16>() : nullptr;
  Out* dst = out.data_ptr<Out>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      int64_t r0 = 0;
      for (; r0 + Kind::ROWS <= n; r0 += Kind::ROWS)
        block_tile<Kind, Kind::ROWS, Out>(words, rows, sums.data(), b, in, outs, tile, r0, dst);
      if (r0 < n)  // the last rows (fewer than Kind::ROWS) in one pass
        with_count<Kind::ROWS - 1>(n - r0, [&](auto rest) {
          block_tile<Kind, decltype(rest)::value, Out>(words, rows, sums.data(), b, in, outs, tile, r0, dst);
        });
    }
  });
  return out;
}

at::Tensor q4_mm(const at::Tensor& x, const at::Tensor& blocks, int64_t outs, const at::Tensor& bias) {
  return blocks_mm<Q4Blocks>(x, blocks, outs, bias);
}

// the LM head's product: logits in fp32 (bf16 logits step by 0.125 at 30, which settles near-ties by rounding)
at::Tensor q8_mm(const at::Tensor& x, const at::Tensor& blocks, int64_t outs, const at::Tensor& bias) {
  return blocks_mm<Q8Blocks, float>(x, blocks, outs, bias);
}

struct Linear {  // one product from 4-bit codes (q4_mm's blocks)
  at::Tensor blocks, bias;
  at::Tensor operator()(const at::Tensor& x) const {  // (N, in) bf16 -> (N, out) bf16
    return q4_mm(x, blocks, blocks.size(0) * TILE, bias);
  }
};

// x (N,) fp32 -> bf16 through simd::store, the rounding every bf16 result of the step takes (for its test)
at::Tensor round_bf16(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be (N,) fp32");
  auto out = at::empty({x.size(0)}, x.options().dtype(at::kBFloat16));
  const float* src = x.data_ptr<float>();
  for (int64_t i = 0, n = x.size(0); i < n; i += LANES) store(out.data_ptr<bf16>() + i, load(src + i, n - i), n - i);
  return out;
}

// residual (T, E) fp32 += x (T, E) bf16
void add_into(at::Tensor& residual, const at::Tensor& x) {
  float* dst = residual.data_ptr<float>();
  const bf16* src = x.data_ptr<bf16>();
  for (int64_t i = 0, n = residual.numel(); i < n; i += LANES) store(dst + i, load(dst + i, n - i) + load(src + i, n - i), n - i);
}

// gate_up (T, 2I) bf16 -> silu(gate) * up (T, I) bf16
at::Tensor silu_mul(const at::Tensor& gate_up) {
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  auto out = at::empty({rows, width}, gate_up.options());
  for (int64_t t = 0; t < rows; ++t) {
    const bf16* gate = gate_up.data_ptr<bf16>() + t * 2 * width;
    const bf16* up = gate + width;
    bf16* dst = out.data_ptr<bf16>() + t * width;
    for (int64_t i = 0; i < width; i += LANES) {
      const V16 g = load(gate + i, width - i);
      store(dst + i, g / (splat(1.0f) + exp(zeros() - g)) * load(up + i, width - i), width - i);
    }
  }
  return out;
}

constexpr int64_t MAX_CHUNKS = 8;  // the head dims the attention serves: up to 128

struct Shape {
  int64_t fed, past, heads, kv_heads, dim, rep;
};

// one head of one row, (D,) bf16 at src -> (D,) fp32: optional per-head RMSNorm (Qwen3), then the rotary embedding
// x * cos + roll(x, D/2) * signed_sin, times `scale`
void rotate(const bf16* src, const at::Tensor& norm, double eps, const float* cos, const float* sin, int64_t dim,
            float scale, float* out) {
  float x[LANES * MAX_CHUNKS], rolled[LANES * MAX_CHUNKS];  // x and roll(x, D/2): element d holds x[(d + D/2) % D]
  for (int64_t d = 0; d < dim; d += LANES) store(x + d, load(src + d, dim - d), dim - d);
  if (norm.numel()) rms_norm_row(x, norm.data_ptr<bf16>(), dim, eps, x);
  const int64_t half = dim / 2;
  std::memcpy(rolled, x + half, static_cast<size_t>(dim - half) * sizeof(float));
  std::memcpy(rolled + dim - half, x, static_cast<size_t>(half) * sizeof(float));
  for (int64_t d = 0; d < dim; d += LANES) {
    const int64_t n = dim - d;
    store(out + d, fma(load(rolled + d, n), load(sin + d, n), load(x + d, n) * load(cos + d, n)) * splat(scale), n);
  }
}

// attention of fed row t's query heads h0 .. h0 + HEADS - 1 (all of one key/value head, g = h0 / R) over its visible
// keys: the P cached ones, then the fed ones it sees (visible (T, T)) by increasing index, that is in the order of
// their compact index c, which is the position each would hold in a chain; writes out (T, H * D) bf16 at row t, those
// heads. CHUNKS = D / 16 rounded up. Every cached key and value is read and widened once for the HEADS heads (grouped
// query attention shares them), 16 dimensions at a time in the mixed lane order (simd::load_mixed; a head dim that is
// no multiple of 16 reads its last chunk short); each head's queries and weighted sums are the same operations in the
// same order as with one head a call, so a row's values do not depend on how heads are grouped
template <int CHUNKS, int HEADS>
void attend_heads(int64_t h0, int64_t t, const Shape& s, const std::vector<float>& queries /* (T, H, D) */,
                  const at::Tensor& keys, const at::Tensor& values, const bool* visible, bf16* out) {
  const int64_t dim = s.dim, g = h0 / s.rep, kstride = keys.stride(1), vstride = values.stride(1);
  const bf16* kbase = keys.data_ptr<bf16>() + g * keys.stride(0);
  const bf16* vbase = values.data_ptr<bf16>() + g * values.stride(0);
  std::vector<int64_t> fed_rows;  // the cache rows of the row's visible fed keys
  for (int64_t j = 0; j < s.fed; ++j)
    if (visible[t * s.fed + j]) fed_rows.push_back(s.past + j);
  auto cache_row = [&](int64_t c) { return c < s.past ? c : fed_rows[c - s.past]; };  // compact index -> cache row
  const int64_t length = s.past + static_cast<int64_t>(fed_rows.size());  // its keys by compact index
  const int64_t last = dim - (CHUNKS - 1) * LANES;  // dimensions in the last chunk (16 for a multiple of 16)
  auto chunk = [&](const bf16* row, int i) {  // dimensions 16i .. 16i + 15 of a cached row, in the mixed order
    return i + 1 < CHUNKS || last == LANES ? load_mixed(row + i * LANES) : load_mixed(row + i * LANES, last);
  };
  V16 query[HEADS][CHUNKS];  // (D,) each, in the mixed order
  for (int h = 0; h < HEADS; ++h) {
    const float* q = queries.data() + (t * s.heads + h0 + h) * dim;
    for (int i = 0; i < CHUNKS; ++i) query[h][i] = mix(load(q + i * LANES, dim - i * LANES));
  }
  std::vector<float> scores(HEADS * length);  // (HEADS, C) scores, then unnormalised softmax weights
  float* w[HEADS];
  for (int h = 0; h < HEADS; ++h) w[h] = scores.data() + h * length;
  auto scored = [&](int64_t c, V16* parts) {  // key c's lane-wise products with each head's query
    const bf16* key = kbase + cache_row(c) * kstride;
    const V16 first_chunk = chunk(key, 0);
    for (int h = 0; h < HEADS; ++h) parts[h] = query[h][0] * first_chunk;
    for (int i = 1; i < CHUNKS; ++i) {
      const V16 dims = chunk(key, i);
      for (int h = 0; h < HEADS; ++h) parts[h] = fma(query[h][i], dims, parts[h]);
    }
  };
  for (int64_t c = 0; c < length; c += LANES) {
    float* at[HEADS];
    for (int h = 0; h < HEADS; ++h) at[h] = w[h] + c;
    dots<HEADS>(std::min<int64_t>(LANES, length - c), [&](int64_t k, V16* parts) { scored(c + k, parts); }, at);
  }
  V16 total[HEADS];
  for (int h = 0; h < HEADS; ++h) {
    V16 peak = splat(-3.0e38f);  // the maximum is exact in any order
    for (int64_t c = 0; c < length; c += LANES) peak = max(peak, load_or(w[h] + c, length - c, -3.0e38f));
    const V16 shift = splat(top(peak));
    for (int64_t c = 0; c < length; c += LANES) store(w[h] + c, exp(load(w[h] + c, length - c) - shift), length - c);
    total[h] = splat(lane_sum(w[h], length, false));
  }
  // the weighted sums of values, key by key in compact order, SPAN chunks of every head at a time held in registers
  constexpr int SPAN = std::min(CHUNKS, std::min(4, std::max(1, (REGISTERS - 2) / HEADS)));
  for (int i0 = 0; i0 < CHUNKS; i0 += SPAN) {
    V16 mixed[HEADS][SPAN];
    for (int h = 0; h < HEADS; ++h)
      for (int i = 0; i < SPAN; ++i) mixed[h][i] = zeros();
    for (int64_t c = 0; c < length; ++c) {
      const bf16* row = vbase + cache_row(c) * vstride;
      for (int i = 0; i < SPAN; ++i) {
        if (i0 + i >= CHUNKS) break;
        const V16 dims = chunk(row, i0 + i);
        for (int h = 0; h < HEADS; ++h) mixed[h][i] = fma(splat(w[h][c]), dims, mixed[h][i]);
      }
    }
    for (int h = 0; h < HEADS; ++h) {
      bf16* dst = out + (t * s.heads + h0 + h) * dim;
      for (int i = 0; i < SPAN && i0 + i < CHUNKS; ++i) {
        const int64_t d0 = (i0 + i) * LANES;
        store(dst + d0, mix(mixed[h][i] / total[h]), dim - d0);
      }
    }
  }
}

// the query heads one attention call takes together: the largest divisor of R (query heads a key/value head) up to
// MAX_HEADS, so a call never spans two key/value heads
constexpr int64_t MAX_HEADS = 4;
inline int64_t heads_a_call(int64_t rep) {
  for (int64_t n = std::min(rep, MAX_HEADS); n > 1; --n)
    if (rep % n == 0) return n;
  return 1;
}

// qkv (T, (H + 2G) D) bf16 -> attention output (T, H D) bf16; the fed keys and values written to the cache at P..
at::Tensor attention(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& visible,
                     const Shape& s, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& q_norm,
                     const at::Tensor& k_norm, double eps, double scale) {
  const int64_t dim = s.dim, width = (s.heads + 2 * s.kv_heads) * dim;
  std::vector<float> queries(s.fed * s.heads * dim), key(dim);
  for (int64_t t = 0; t < s.fed; ++t) {
    const bf16* row = qkv.data_ptr<bf16>() + t * width;
    const float* c = cos.data_ptr<float>() + t * dim;
    const float* sn = sin.data_ptr<float>() + t * dim;
    for (int64_t h = 0; h < s.heads; ++h)
      rotate(row + h * dim, q_norm, eps, c, sn, dim, static_cast<float>(scale), queries.data() + (t * s.heads + h) * dim);
    for (int64_t g = 0; g < s.kv_heads; ++g) {
      rotate(row + (s.heads + g) * dim, k_norm, eps, c, sn, dim, 1.0f, key.data());
      bf16* kdst = keys.data_ptr<bf16>() + g * keys.stride(0) + (s.past + t) * keys.stride(1);
      bf16* vdst = values.data_ptr<bf16>() + g * values.stride(0) + (s.past + t) * values.stride(1);
      const bf16* vsrc = row + (s.heads + s.kv_heads + g) * dim;
      for (int64_t d = 0; d < dim; d += LANES) store(kdst + d, load(key.data() + d, dim - d), dim - d);
      std::memcpy(vdst, vsrc, static_cast<size_t>(dim) * sizeof(bf16));
    }
  }
  auto out = at::empty({s.fed, s.heads * dim}, qkv.options());
  const bool* seen = visible.data_ptr<bool>();
  // one unit of work per (group of query heads, fed row): every value is the same operations whichever unit or
  // thread computes it, and the work spreads over the threads (SmolLM2's three key/value heads, one a thread, did not)
  const int64_t group = heads_a_call(s.rep), per_row = s.heads / group;
  with_count<MAX_CHUNKS>((dim + LANES - 1) / LANES, [&](auto chunks) {
    with_count<MAX_HEADS>(group, [&](auto heads) {
      at::parallel_for(0, per_row * s.fed, 1, [&](int64_t begin, int64_t end) {
        for (int64_t unit = begin; unit < end; ++unit)
          attend_heads<decltype(chunks)::value, decltype(heads)::value>(
              unit % per_row * group, unit / per_row, s, queries, keys, values, seen, out.data_ptr<bf16>());
      });
    });
  });
  return out;
}

constexpr int64_t SLOTS = 12;  // tensors per layer, in this order:
enum Slot { IN_NORM, QKV, QKV_BIAS, O, O_BIAS, POST_NORM, GATE_UP, GATE_UP_BIAS, DOWN, DOWN_BIAS, Q_NORM, K_NORM };

// x (T, E) bf16 embeddings of the fed positions -> [residual after the last layer (T, E) bf16, then the residual after
// each layer in `state_layers` (1-based), (T, E) bf16 each]. cos, signed sin (T, D) fp32; visible (T, T) bool;
// weights: SLOTS per layer (an empty tensor where a layer has no such tensor); keys, values: each layer's cache
// (G, S, D) and (G, S, D or D + 1) bf16, P positions valid.
std::vector<at::Tensor> layers(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& visible, int64_t past, const std::vector<at::Tensor>& weights,
                               const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                               int64_t heads, int64_t kv_heads, double eps,
                               const std::vector<int64_t>& state_layers, const at::Tensor& final_norm) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x must be (T, E) bf16");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous(), "cos, sin must be contiguous fp32");
  TORCH_CHECK(visible.scalar_type() == at::kBool && visible.is_contiguous(), "visible must be (T, T) bool");
  const int64_t n_layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == n_layers * SLOTS, "expected ", SLOTS, " tensors a layer");
  const int64_t dim = keys[0].size(2);
  TORCH_CHECK(past + x.size(0) <= keys[0].size(1), "static KV cache full");
  TORCH_CHECK(dim <= LANES * MAX_CHUNKS, "head dim ", dim, " is over ", LANES * MAX_CHUNKS);
  const Shape s{x.size(0), past, heads, kv_heads, dim, heads / kv_heads};
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  at::Tensor residual = x.to(at::kFloat);  // (T, E) fp32
  std::vector<at::Tensor> result{at::Tensor()};
  for (int64_t i = 0; i < n_layers; ++i) {
    const at::Tensor* w = weights.data() + i * SLOTS;
    const Linear qkv{w[QKV], w[QKV_BIAS]}, o{w[O], w[O_BIAS]}, gate_up{w[GATE_UP], w[GATE_UP_BIAS]};
    const Linear down{w[DOWN], w[DOWN_BIAS]};
    auto mixed = attention(qkv(rms_norm(residual, w[IN_NORM], eps)), cos, sin, visible, s, keys[i], values[i],
                           w[Q_NORM], w[K_NORM], eps, scale);
    add_into(residual, o(mixed));
    add_into(residual, down(silu_mul(gate_up(rms_norm(residual, w[POST_NORM], eps)))));
    for (int64_t layer : state_layers)
      if (layer == i + 1) result.push_back(residual.to(at::kBFloat16));
  }
  // the model's final norm here where its weight is given (in Python: six small ops a step, docs/journal/engine.md)
  result[0] = final_norm.numel() ? rms_norm(residual, final_norm, eps) : residual.to(at::kBFloat16);
  return result;
}

// A list of tensors handed over once and kept on the C++ side (a model's weights, a cache's keys or values): pybind's
// conversion of the step's Python lists of 420 tensors at every call was dear, the more so after a forward
// (docs/journal/engine.md).
struct Tensors {
  explicit Tensors(std::vector<at::Tensor> items) : items(std::move(items)) {}
  std::vector<at::Tensor> items;
};

// The rows of a (N, W) table at these indices -> (T, W), each row copied as it is.
at::Tensor gather_rows(const at::Tensor& table, const std::vector<int64_t>& index) {
  const int64_t rows = table.size(0), width = table.size(1), bytes = width * table.element_size();
  auto out = at::empty({static_cast<int64_t>(index.size()), width}, table.options());
  const char* src = static_cast<const char*>(table.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (size_t t = 0; t < index.size(); ++t) {
    TORCH_CHECK(0 <= index[t] && index[t] < rows, "index ", index[t], " is outside the table's ", rows, " rows");
    std::memcpy(dst + t * bytes, src + index[t] * bytes, bytes);
  }
  return out;
}

// One forward from token ids to logits: the embedding rows of `ids`, the rotary tables' rows at `positions` (empty:
// past, past + 1, ...), which fed positions each row sees (`visible` (T, T) bool; an empty tensor: a causal chain),
// the decoder layers and the final norm (`layers`, whose arithmetic this leaves unchanged), then the LM head from its
// 8-bit codes over the last `keep` rows (0: all). Returns [logits (T or keep, V) fp32, features (T, F) bf16: the
// states at `feature_layers` side by side, 0 = the embeddings, L = the normalised last layer (an empty tensor for
// none)]. Why one call: the layers stream the weights through every cache, and afterwards each torch op Python
// dispatches costs many times its usual microseconds (its code and data come back from memory; docs/journal/engine.md,
// "Measurements behind the code's rules").
std::vector<at::Tensor> step(const std::vector<int64_t>& ids, const at::Tensor& embedding, const at::Tensor& cos_table,
                             const at::Tensor& sin_table, std::vector<int64_t> positions, at::Tensor visible,
                             int64_t past, const Tensors& weights, const Tensors& keys, const Tensors& values,
                             int64_t heads, int64_t kv_heads, double eps,
                             const std::vector<int64_t>& feature_layers, const at::Tensor& final_norm,
                             const at::Tensor& head_blocks, int64_t vocab, const at::Tensor& head_bias, int64_t keep) {
  const int64_t fed = static_cast<int64_t>(ids.size()), n_layers = static_cast<int64_t>(keys.items.size());
  TORCH_CHECK(fed > 0, "no ids to feed");
  TORCH_CHECK(embedding.dim() == 2 && embedding.scalar_type() == at::kBFloat16 && embedding.is_contiguous(),
              "embedding must be (V, E) bf16");
  TORCH_CHECK(cos_table.scalar_type() == at::kFloat && sin_table.scalar_type() == at::kFloat &&
              cos_table.is_contiguous() && sin_table.is_contiguous(), "rotary tables must be contiguous (S, D) fp32");
  TORCH_CHECK(final_norm.numel(), "the final norm's weight is required");
  if (positions.empty())
    for (int64_t t = 0; t < fed; ++t) positions.push_back(past + t);
  TORCH_CHECK(static_cast<int64_t>(positions.size()) == fed, "one position a fed id");
  if (!visible.numel()) {  // a causal chain: row t sees fed rows 0 .. t
    visible = at::zeros({fed, fed}, at::kBool);
    bool* seen = visible.data_ptr<bool>();
    for (int64_t t = 0; t < fed; ++t)
      for (int64_t j = 0; j <= t; ++j) seen[t * fed + j] = true;
  }
  TORCH_CHECK(visible.size(0) == fed && visible.size(1) == fed, "visible must be (T, T)");
  const at::Tensor x = gather_rows(embedding, ids);  // (T, E)
  std::vector<int64_t> inner;  // the decoder layers whose states are features, by increasing index
  for (int64_t layer : feature_layers)
    if (0 < layer && layer < n_layers) inner.push_back(layer);
  std::sort(inner.begin(), inner.end());
  inner.erase(std::unique(inner.begin(), inner.end()), inner.end());
  auto out = layers(x, gather_rows(cos_table, positions), gather_rows(sin_table, positions), visible.contiguous(),
                    past, weights.items, keys.items, values.items, heads, kv_heads, eps, inner, final_norm);
  const at::Tensor& last = out[0];  // (T, E) normalised
  std::vector<at::Tensor> states;  // as LeanForward.head orders them: embeddings, inner layers, the last
  auto wanted = [&](int64_t layer) {
    return std::find(feature_layers.begin(), feature_layers.end(), layer) != feature_layers.end();
  };
  if (wanted(0)) states.push_back(x);
  states.insert(states.end(), out.begin() + 1, out.end());
  if (wanted(n_layers)) states.push_back(last);
  const at::Tensor rows = keep > 0 && keep < fed ? last.slice(0, fed - keep).contiguous() : last;  // (T or keep, E)
  return {q8_mm(rows, head_blocks, vocab, head_bias), states.empty() ? at::Tensor() : at::cat(states, 1)};
}

// After a tree round: position past + kept[i] moves to past + i in every layer's keys and values (G, S, D), each
// row copied as it is. kept is increasing from 0 (the anchor), so kept[i] >= i and no row is overwritten before it
// moves. In Python this was two indexed copies a layer, dear after a forward (docs/journal/engine.md).
void keep_rows(const Tensors& keys, const Tensors& values, int64_t past, const std::vector<int64_t>& kept) {
  for (size_t i = 0; i < kept.size(); ++i)
    TORCH_CHECK(kept[i] >= static_cast<int64_t>(i) && (i == 0 || kept[i] > kept[i - 1]), "kept must be increasing");
  for (const Tensors* list : {&keys, &values})
    for (const at::Tensor& t : list->items) {
      TORCH_CHECK(t.dim() == 3 && t.is_contiguous(), "cache tensors must be contiguous (G, S, D)");
      TORCH_CHECK(kept.empty() || past + kept.back() < t.size(1), "kept position beyond the cache");
      const int64_t groups = t.size(0), capacity = t.size(1), bytes = t.size(2) * t.element_size();
      char* base = static_cast<char*>(t.data_ptr());
      for (int64_t g = 0; g < groups; ++g)
        for (size_t i = 0; i < kept.size(); ++i)
          if (kept[i] != static_cast<int64_t>(i))
            std::memcpy(base + (g * capacity + past + static_cast<int64_t>(i)) * bytes,
                        base + (g * capacity + past + kept[i]) * bytes, bytes);
    }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Tensors>(m, "Tensors", "a list of tensors kept on the C++ side (step's weights, keys, values)")
      .def(py::init<std::vector<at::Tensor>>());
  m.def("layers", &layers, "the decoder layers of a q4 forward over at most a verify round's positions, then the "
        "final norm where its weight is given");
  m.def("step", &step, "one forward of at most a verify round's positions from token ids to logits: embedding, "
        "rotary rows, the layers, the final norm and the 8-bit LM head, with the features at the given layers");
  m.def("prefetch_blocks", [] { return prefetch_blocks; }, "how many blocks ahead the products prefetch now");
  m.def("set_prefetch_blocks", &set_prefetch_blocks, "how many blocks ahead the products prefetch their weight "
        "(0: none), for the comparison that measures it (scripts.prefetch_ab)");
  m.def("keep_rows", &keep_rows, "move a tree round's kept positions into place in every layer's keys and values");
  m.def("q4_mm", &q4_mm, "x (N, I) bf16 times a weight packed in blocks of 16 x 32 4-bit codes -> (N, O) bf16");
  m.def("round_bf16", &round_bf16, "x (N,) fp32 -> bf16 as the step rounds its bf16 results (to the nearest even)");
  m.def("q8_mm", &q8_mm, "x (N, I) bf16 times a weight packed in blocks of 16 x 32 8-bit codes -> (N, O) fp32");
  m.attr("SLOTS") = SLOTS;
  m.attr("MAX_HEAD_DIM") = LANES * MAX_CHUNKS;  // the attention holds a head in registers
  m.attr("LAYOUT") = LAYOUT;  // how q4_mm's blocks arrange the codes (core.runtime.cpu_linear)
  m.attr("Q8_LAYOUT") = Q8_LAYOUT;  // and q8_mm's
  m.attr("ACTIVATIONS") = ACTIVATIONS;  // what the products multiply the weight codes by
}
