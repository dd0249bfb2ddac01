// Sixteen-lane float arithmetic shared by the native kernels (core/runtime/csrc/lean_step.cpp,
// drafter/runtime/csrc/dit_trunk.cpp): AVX-512 where the build has it, else plain arrays doing the same lane-wise
// operations, so the portable build computes what the vector build computes. Built with -ffp-contract=off: a product
// and a sum fuse only where written.
#pragma once
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace simd {
using bf16 = at::BFloat16;
constexpr int LANES = 16;

inline float fma_(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

// Sixteen float lanes: AVX-512 where the build has it, two AVX2 halves where that is the widest, else plain arrays
// doing the same lane-wise operations (a machine computes every row with one of them, so rows stay equal to each other
// whichever it is). REGISTERS: how many V16 values the register file holds, which sizes the kernels' register tiles.
#if defined(__AVX512F__)
constexpr int REGISTERS = 32;
struct V16 {
  __m512 v;
};
inline V16 zeros() { return {_mm512_setzero_ps()}; }
inline V16 splat(float x) { return {_mm512_set1_ps(x)}; }
inline __mmask16 first(int64_t n) {  // the first n lanes (none for n <= 0)
  return n >= LANES ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}
inline V16 load(const float* p, int64_t n = LANES) { return {_mm512_maskz_loadu_ps(first(n), p)}; }
inline V16 load_or(const float* p, int64_t n, float fill) { return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), first(n), p)}; }
inline V16 load(const bf16* p, int64_t n = LANES) {  // bf16 -> fp32 is the 16 bits moved up
  const __m256i raw = _mm256_maskz_loadu_epi16(first(n), p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16))};
}
inline void store(float* p, V16 x, int64_t n = LANES) { _mm512_mask_storeu_ps(p, first(n), x.v); }
// fp32 -> bf16 rounded to the nearest even, NaN as 0x7FC0: c10::BFloat16(float)'s bits, sixteen lanes at a time
inline void store(bf16* p, V16 x, int64_t n = LANES) {
  const __m512i bits = _mm512_castps_si512(x.v), one = _mm512_set1_epi32(1);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(bits, 16), one), _mm512_set1_epi32(0x7FFF));
  const __m512i rounded = _mm512_mask_mov_epi32(_mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16),
                                                _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(p, first(n), _mm512_cvtepi32_epi16(rounded));
}
// the attention's lane order (load_mixed, mix; AVX2 below): here the natural one
inline V16 load_mixed(const bf16* p, int64_t n = LANES) { return load(p, n); }
inline V16 mix(V16 a) { return a; }
inline V16 operator+(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 operator-(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 operator*(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 operator/(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 max(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V16 min(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V16 floor(V16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)}; }
inline V16 pow2(V16 k) {  // 2^k for whole k in -126..127
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k.v), _mm512_set1_epi32(127)), 23))};
}
inline V16 abs(V16 a) { return {_mm512_abs_ps(a.v)}; }
inline V16 copysign(V16 magnitude, V16 sign) {  // |magnitude| with sign's sign bit
  const __m512i bit = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  return {_mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(bit, _mm512_castps_si512(magnitude.v)),
                                              _mm512_and_si512(bit, _mm512_castps_si512(sign.v))))};
}
inline V16 from_halves(__m256 lo, __m256 hi) {  // lanes 0..7, 8..15
  return {_mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1))};
}
inline float sum(V16 a) { return _mm512_reduce_add_ps(a.v); }
inline float top(V16 a) { return _mm512_reduce_max_ps(a.v); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int REGISTERS = 8;  // sixteen ymm registers, two a V16
struct V16 {
  __m256 lo, hi;  // lanes 0..7, 8..15
};
inline __m256i half_mask(int64_t n) {  // the first n of eight lanes (none for n <= 0)
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(std::max<int64_t>(n, 0), 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V16 zeros() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 splat(float x) { const __m256 v = _mm256_set1_ps(x); return {v, v}; }
inline V16 load(const float* p, int64_t n = LANES) {
  if (n >= LANES) return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  return {_mm256_maskload_ps(p, half_mask(n)), _mm256_maskload_ps(p + 8, half_mask(n - 8))};
}
inline V16 load_or(const float* p, int64_t n, float fill) {
  const V16 loaded = load(p, n), filled = splat(fill);
  return {_mm256_blendv_ps(filled.lo, loaded.lo, _mm256_castsi256_ps(half_mask(n))),
          _mm256_blendv_ps(filled.hi, loaded.hi, _mm256_castsi256_ps(half_mask(n - 8)))};
}
inline __m256 widen(__m128i raw) {  // eight bf16 -> fp32: the 16 bits moved up
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline V16 load(const bf16* p, int64_t n = LANES) {
  __m256i raw;
  if (n >= LANES) {
    raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {  // no 16-bit masked load in AVX2: the lanes there are, through a zeroed copy
    alignas(32) uint16_t part[LANES] = {};
    if (n > 0) std::memcpy(part, p, static_cast<size_t>(n) * sizeof(bf16));
    raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(part));
  }
  return {widen(_mm256_castsi256_si128(raw)), widen(_mm256_extracti128_si256(raw, 1))};
}
inline void store(float* p, V16 x, int64_t n = LANES) {
  if (n >= LANES) {
    _mm256_storeu_ps(p, x.lo);
    _mm256_storeu_ps(p + 8, x.hi);
    return;
  }
  _mm256_maskstore_ps(p, half_mask(n), x.lo);
  _mm256_maskstore_ps(p + 8, half_mask(n - 8), x.hi);
}
inline __m256i bf16_bits(__m256 x) {  // eight fp32 -> their bf16 bits in 32-bit lanes, as store(bf16*) below
  const __m256i bits = _mm256_castps_si256(x), one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 16), one), _mm256_set1_epi32(0x7FFF));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}
// fp32 -> bf16 rounded to the nearest even, NaN as 0x7FC0: c10::BFloat16(float)'s bits, sixteen lanes at a time
inline void store(bf16* p, V16 x, int64_t n = LANES) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(x.lo), bf16_bits(x.hi)), 0xD8);
  if (n >= LANES) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
    return;
  }
  alignas(32) uint16_t part[LANES];  // fewer than 16: the lanes there are, through a copy
  _mm256_store_si256(reinterpret_cast<__m256i*>(part), packed);
  if (n > 0) std::memcpy(p, part, static_cast<size_t>(n) * sizeof(bf16));
}
// Sixteen bf16 -> fp32 in the lane order two unpacks give (dimensions 0-3, 8-11 | 4-7, 12-15): one instruction a half
// where the natural order takes three. The attention reads its cached keys and values this way, with its queries
// brought to the same order by mix() (and its results back by mix() again: the order is its own inverse), so lane-wise
// products pair the same dimensions and every sum runs in one fixed order.
inline V16 load_mixed(const bf16* p, int64_t n = LANES) {
  alignas(32) uint16_t part[LANES] = {};  // fewer than 16: the lanes there are, through a zeroed copy
  if (n < LANES && n > 0) std::memcpy(part, p, static_cast<size_t>(n) * sizeof(bf16));
  const void* from = n < LANES ? static_cast<const void*>(part) : static_cast<const void*>(p);
  const __m256i raw = _mm256_loadu_si256(static_cast<const __m256i*>(from)), zero = _mm256_setzero_si256();
  return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw))};
}
inline V16 mix(V16 a) { return {_mm256_permute2f128_ps(a.lo, a.hi, 0x20), _mm256_permute2f128_ps(a.lo, a.hi, 0x31)}; }
#define HALVES(op) return {op(a.lo, b.lo), op(a.hi, b.hi)}
inline V16 operator+(V16 a, V16 b) { HALVES(_mm256_add_ps); }
inline V16 operator-(V16 a, V16 b) { HALVES(_mm256_sub_ps); }
inline V16 operator*(V16 a, V16 b) { HALVES(_mm256_mul_ps); }
inline V16 operator/(V16 a, V16 b) { HALVES(_mm256_div_ps); }
inline V16 max(V16 a, V16 b) { HALVES(_mm256_max_ps); }
inline V16 min(V16 a, V16 b) { HALVES(_mm256_min_ps); }
#undef HALVES
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V16 from_halves(__m256 lo, __m256 hi) { return {lo, hi}; }
inline V16 floor(V16 a) { return {_mm256_floor_ps(a.lo), _mm256_floor_ps(a.hi)}; }
inline __m256 pow2_half(__m256 k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
}
inline V16 pow2(V16 k) { return {pow2_half(k.lo), pow2_half(k.hi)}; }  // 2^k for whole k in -126..127
inline V16 abs(V16 a) {
  const __m256 bit = _mm256_set1_ps(-0.0f);
  return {_mm256_andnot_ps(bit, a.lo), _mm256_andnot_ps(bit, a.hi)};
}
inline V16 copysign(V16 magnitude, V16 sign) {  // |magnitude| with sign's sign bit
  const __m256 bit = _mm256_set1_ps(-0.0f);
  return {_mm256_or_ps(_mm256_andnot_ps(bit, magnitude.lo), _mm256_and_ps(bit, sign.lo)),
          _mm256_or_ps(_mm256_andnot_ps(bit, magnitude.hi), _mm256_and_ps(bit, sign.hi))};
}
inline float sum(V16 a) {  // the portable tree: lane i + lane i + 8, then + 4, + 2, + 1
  const __m256 eight = _mm256_add_ps(a.lo, a.hi);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}
inline float top(V16 a) {
  const __m256 eight = _mm256_max_ps(a.lo, a.hi);
  __m128 four = _mm_max_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  four = _mm_max_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_max_ss(four, _mm_shuffle_ps(four, four, 1)));
}
#else
constexpr int REGISTERS = 8;  // sized as for AVX2: the compiler spreads the arrays over whatever vectors it has
struct V16 {
  float v[LANES];
};
inline V16 zeros() { return V16{}; }
inline V16 splat(float x) { V16 r; for (int l = 0; l < LANES; ++l) r.v[l] = x; return r; }
inline V16 load(const float* p, int64_t n = LANES) { V16 r{}; for (int64_t l = 0; l < n && l < LANES; ++l) r.v[l] = p[l]; return r; }
inline V16 load(const bf16* p, int64_t n = LANES) { V16 r{}; for (int64_t l = 0; l < n && l < LANES; ++l) r.v[l] = static_cast<float>(p[l]); return r; }
inline V16 load_or(const float* p, int64_t n, float fill) { V16 r = splat(fill); for (int64_t l = 0; l < n && l < LANES; ++l) r.v[l] = p[l]; return r; }
inline void store(float* p, V16 x, int64_t n = LANES) { for (int64_t l = 0; l < n && l < LANES; ++l) p[l] = x.v[l]; }
inline void store(bf16* p, V16 x, int64_t n = LANES) { for (int64_t l = 0; l < n && l < LANES; ++l) p[l] = bf16(x.v[l]); }
inline V16 load_mixed(const bf16* p, int64_t n = LANES) { return load(p, n); }  // the attention's lane order: natural here
inline V16 mix(V16 a) { return a; }
#define LANEWISE(expr) V16 r; for (int l = 0; l < LANES; ++l) r.v[l] = (expr); return r
inline V16 operator+(V16 a, V16 b) { LANEWISE(a.v[l] + b.v[l]); }
inline V16 operator-(V16 a, V16 b) { LANEWISE(a.v[l] - b.v[l]); }
inline V16 operator*(V16 a, V16 b) { LANEWISE(a.v[l] * b.v[l]); }
inline V16 operator/(V16 a, V16 b) { LANEWISE(a.v[l] / b.v[l]); }
inline V16 fma(V16 a, V16 b, V16 c) { LANEWISE(fma_(a.v[l], b.v[l], c.v[l])); }
inline V16 max(V16 a, V16 b) { LANEWISE(a.v[l] > b.v[l] ? a.v[l] : b.v[l]); }
inline V16 min(V16 a, V16 b) { LANEWISE(a.v[l] < b.v[l] ? a.v[l] : b.v[l]); }
inline V16 floor(V16 a) { LANEWISE(__builtin_floorf(a.v[l])); }
inline V16 abs(V16 a) { LANEWISE(__builtin_fabsf(a.v[l])); }
inline V16 copysign(V16 magnitude, V16 sign) { LANEWISE(__builtin_copysignf(magnitude.v[l], sign.v[l])); }
inline V16 pow2(V16 k) {
  V16 r;
  for (int l = 0; l < LANES; ++l) {
    const int32_t bits = (static_cast<int32_t>(k.v[l]) + 127) << 23;
    std::memcpy(&r.v[l], &bits, sizeof(float));
  }
  return r;
}
#undef LANEWISE
inline float sum(V16 a) {  // pairwise in a fixed tree
  for (int width = LANES / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) a.v[l] += a.v[l + width];
  return a.v[0];
}
inline float top(V16 a) { float t = a.v[0]; for (int l = 1; l < LANES; ++l) t = a.v[l] > t ? a.v[l] : t; return t; }
#endif

// exp by range reduction and a degree-6 polynomial (Cephes' expf), lane by lane: a value's exponential does not
// depend on the vector it was computed in
inline V16 exp(V16 x) {
  x = min(max(x, splat(-87.0f)), splat(88.0f));
  const V16 k = floor(fma(x, splat(1.44269504088896341f), splat(0.5f)));
  V16 r = fma(k, splat(-0.693359375f), x);
  r = fma(k, splat(2.12194440e-4f), r);
  V16 p = splat(1.9875691500e-4f);
  p = fma(p, r, splat(1.3981999507e-3f));
  p = fma(p, r, splat(8.3334519073e-3f));
  p = fma(p, r, splat(4.1665795894e-2f));
  p = fma(p, r, splat(1.6666665459e-1f));
  p = fma(p, r, splat(5.0000001201e-1f));
  p = fma(p, r * r, r) + splat(1.0f);
  return p * pow2(k);
}

// x (n,) -> sum of x[i] (or x[i]^2) with element i in lane i % 16, the lanes then reduced in a fixed order
template <typename T>
inline float lane_sum(const T* x, int64_t n, bool squares) {
  V16 acc = zeros();
  for (int64_t i = 0; i < n; i += LANES) {
    const V16 v = load(x + i, n - i);
    acc = squares ? fma(v, v, acc) : acc + v;
  }
  return sum(acc);
}

// f(std::integral_constant<int, n>{}) for a run-time count n in 1..N (N for any larger n): calls a kernel written
// for a compile-time count of rows or vectors (its register tile unrolled) with the count at hand
template <int N, typename F>
inline void with_count(int64_t n, F&& f) {
  if constexpr (N > 1) {
    if (n < N) return with_count<N - 1>(n, std::forward<F>(f));
  }
  f(std::integral_constant<int, N>{});
}

}  // namespace simd
