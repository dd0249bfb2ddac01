// Which products the native kernels (core/runtime/csrc/lean_step.cpp, drafter/runtime/csrc/dit_trunk.cpp) build,
// chosen once from the build's instruction set, and the integer products' shared parts.
//
// INTEGER_PRODUCTS: each row's inputs are rounded to signed 8-bit codes per block of 32 with one fp32 scale (GGUF's
// Q8_0 applied to activations, as llama.cpp does), and a block's sum of code products is exact integer arithmetic, so
// every build below computes the same integers, and a row's codes depend on that row alone. Two builds:
// - VNNI_PRODUCTS (AVX512-VNNI: Ice Lake and later, Zen 4 and later): vpdpbusd multiplies 64 unsigned by 64 signed
//   8-bit codes and adds them four at a time into 16 int32 lanes, one instruction for what bf16 pairs do in two. On the
//   AVX512-BF16 EPYC (Zen 4) the target's forwards over 2 to 17 positions took 0.72-0.93 of the bf16 pair build's
//   time, one position within the noise (0.90 and 1.07 in two runs; `python -m lab.products_ab --without
//   avx512vnni`, docs/results/engine/products-ab-vnni-2026-12-04.json), so it is taken over BF16_PRODUCTS where a CPU
//   has both.
// - AVX2 (an AVX-512 CPU without VNNI or BF16 included): vpmaddubsw multiplies 32 unsigned by 32 signed codes and adds
//   neighbours. AVX2 has no bf16 products, and fp32 ones cost ~20 instructions per 32 products a row of the decode
//   step with the unpacking and the broadcasts (faster than torch's int4 kernel, still behind llama.cpp; figures:
//   docs/journal/engine.md).
// BF16_PRODUCTS: AVX512-BF16 without VNNI: pair dot products (bf16 activations times the weight codes, unrounded).
// Else none of them: fp32 products.
//
// Weights with 8-bit codes (core.runtime.cpu_linear.pack_q8_blocks, layout "bytes", GGUF's Q8_0 scheme): blocks of 16 outputs
// x 32 inputs, per block 128 int32 words of signed codes (word 16m + j holds output j's codes of inputs 4m .. 4m + 3),
// then the 16 outputs' scales as fp16 (8 words): w = code * scale.
#pragma once
#include "simd.h"

#include <vector>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define INTEGER_PRODUCTS 1
#define VNNI_PRODUCTS 1
#elif defined(__AVX512BF16__) && defined(__AVX512BW__)
#define BF16_PRODUCTS 1
#elif defined(__AVX2__) && defined(__FMA__)
#define INTEGER_PRODUCTS 1
#endif

namespace products {
using simd::bf16;
using simd::V16;

constexpr int64_t GROUP = 32, TILE = 16;  // inputs a block, outputs a block
constexpr int64_t Q8_WORDS = 136, Q8_SCALES = 128;  // int32 words a q8 block, the first word of its scales

inline V16 load_half(const int32_t* words) {  // 16 fp16 values -> fp32
  V16 r;
#if defined(__AVX512F__)
  r.v = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words)));
#elif defined(__AVX2__) && defined(__F16C__)
  r.lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words)));
  r.hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words) + 1));
#else
  const at::Half* half = reinterpret_cast<const at::Half*>(words);
  for (int l = 0; l < simd::LANES; ++l) r.v[l] = static_cast<float>(half[l]);
#endif
  return r;
}

#if defined(INTEGER_PRODUCTS)
struct Operand {  // one row's block of 32 inputs
  int8_t codes[GROUP];  // round(x * 127 / max |x|)
  float scale;  // max |x| / 127: x ~ code * scale
  // the sum of the codes, so that code_sum * scale is the block's inputs summed as the code products see them: a q4
  // weight's minimum multiplies it (GGUF's Q8_1 sum, as llama.cpp multiplies Q4_1 minimums); and vpdpbusd, which
  // reads the signed weight codes shifted by 128, is corrected by it (q8_dots)
  int32_t code_sum;
};

inline void set_code_sum(Operand& block) {
  block.code_sum = 0;
  for (int i = 0; i < GROUP; ++i) block.code_sum += block.codes[i];
}

// 32 inputs times `inverse`, rounded to the nearest integer (ties to even: the default rounding mode, as nearbyint) ->
// 32 codes: the scalar loop's values, by vector instructions
inline void round_codes(const V16* x, float inverse, int8_t* codes) {
  const V16 by = simd::splat(inverse);
#if defined(__AVX512F__)
  for (int h = 0; h < 2; ++h)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16 * h), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32((x[h] * by).v)));
#else
  const V16 a = x[0] * by, b = x[1] * by;
  const __m256i low = _mm256_packs_epi32(_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi));  // a0-3 a8-11 | a4-7 a12-15
  const __m256i high = _mm256_packs_epi32(_mm256_cvtps_epi32(b.lo), _mm256_cvtps_epi32(b.hi));
  const __m256i bytes = _mm256_packs_epi16(low, high);  // per 128 bits: a 0-3 8-11 b 0-3 8-11 | a 4-7 12-15 b 4-7 12-15
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm256_permutevar8x32_epi32(bytes, order));
#endif
}

// rows x (N, I) (bf16 or fp32) -> (N, ceil(I / 32)) Operand; a last partial block reads its missing inputs as zeros
template <typename T>
std::vector<Operand> quantize_rows(const T* x, int64_t n, int64_t in) {
  const int64_t groups = (in + GROUP - 1) / GROUP;
  std::vector<Operand> out(n * groups);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const T* src = x + r * in + g * GROUP;
      const int64_t count = std::min(GROUP, in - g * GROUP);
      Operand& whole = out[r * groups + g];
      if (count == GROUP) {  // the scalar loop below, 16 lanes at a time: the same maximum, products and rounding
        const V16 v[2] = {simd::load(src), simd::load(src + simd::LANES)};
        const float largest = simd::top(simd::max(simd::abs(v[0]), simd::abs(v[1])));
        round_codes(v, largest > 0.0f ? 127.0f / largest : 0.0f, whole.codes);
        whole.scale = largest / 127.0f;
        set_code_sum(whole);
        continue;
      }
      float value[GROUP] = {}, largest = 0.0f;
      for (int64_t i = 0; i < count; ++i) largest = std::max(largest, std::fabs(value[i] = static_cast<float>(src[i])));
      const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
      Operand& block = out[r * groups + g];
      for (int64_t i = 0; i < GROUP; ++i) block.codes[i] = static_cast<int8_t>(std::nearbyint(value[i] * inverse));
      block.scale = largest / 127.0f;
      set_code_sum(block);
    }
  return out;
}

inline int32_t four(const Operand* x, int m) {  // the codes of inputs 4m .. 4m + 3 as one 32-bit word
  int32_t word;
  std::memcpy(&word, x->codes + 4 * m, sizeof(word));
  return word;
}

inline __m256i four_codes(const Operand* x, int m) { return _mm256_set1_epi32(four(x, m)); }  // in every lane

#if defined(VNNI_PRODUCTS)
inline V16 scaled(__m512i sum, const Operand* x) {  // 16 int32 sums -> 16 fp32 lanes * the row's scale
  return {_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(x->scale))};
}

// dot[r] (16 outputs) = the block's sum over 32 inputs of weight code * row r's code * row r's scale. vpdpbusd wants
// the weight codes unsigned: code + 128 (the sign bit flipped), whose sum of products exceeds the signed one by 128
// times the row's code sum, which each sum starts below by that much. Two sums a row (even and odd m) halve the chain
// of dependent products (one row alone waited on it); integer sums are exact in any association
template <int R>
inline void q8_dots(const int32_t* words, const Operand* const* x, V16* dot) {
  __m512i sum[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    sum[r][0] = _mm512_set1_epi32(-128 * x[r]->code_sum);
    sum[r][1] = _mm512_setzero_si512();
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
  for (int m = 0; m < GROUP / 4; ++m) {
    const __m512i codes = _mm512_xor_si512(_mm512_loadu_si512(words + 16 * m), flip);  // word j: output j, 4m ..
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      sum[r][m & 1] = _mm512_dpbusd_epi32(sum[r][m & 1], codes, _mm512_set1_epi32(four(x[r], m)));
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) dot[r] = scaled(_mm512_add_epi32(sum[r][0], sum[r][1]), x[r]);
}
#else

inline V16 scaled(const __m256i* sums, const Operand* x) {  // two 8-lane int32 sums -> 16 fp32 lanes * the row's scale
  const __m256 scale = _mm256_set1_ps(x->scale);
  return simd::from_halves(_mm256_mul_ps(_mm256_cvtepi32_ps(sums[0]), scale),
                           _mm256_mul_ps(_mm256_cvtepi32_ps(sums[1]), scale));
}

// dot[r] (16 outputs) = the block's sum over 32 inputs of weight code * row r's code * row r's scale. vpmaddubsw wants
// one operand unsigned: |code| times the input code carrying the weight code's sign; each step widened to 32 bits
// (two products of up to 127 * 127 each)
template <int R>
inline void q8_dots(const int32_t* words, const Operand* const* x, V16* dot) {
  __m256i part[R][2];  // outputs 0..7 and 8..15: 32-bit sums
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) part[r][0] = part[r][1] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int m = 0; m < GROUP / 4; ++m) {
    const __m256i codes[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 16 * m)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 16 * m + 8))};
    const __m256i size[2] = {_mm256_abs_epi8(codes[0]), _mm256_abs_epi8(codes[1])};
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i inputs = four_codes(x[r], m);
      for (int h = 0; h < 2; ++h)
        part[r][h] = _mm256_add_epi32(
            part[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(size[h], _mm256_sign_epi8(inputs, codes[h])), ones));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) dot[r] = scaled(part[r], x[r]);
}
#endif  // VNNI_PRODUCTS
#endif  // INTEGER_PRODUCTS

}  // namespace products
