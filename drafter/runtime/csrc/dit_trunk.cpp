// The DiT drafters' trunks as one native call each: the project's network (below) and the released FlashMap DiT
// (release_trunk, further down). The project's trunk at one time pair (drafter/networks/dit.py DraftNet.trunk, drafted
// through drafter/runtime/frozen.py): the slot projection, every block's adaLN-modulated self-attention,
// cross-attention to the cached context maps and GELU MLP, and the output projection. Python dispatched ~130 small ops
// a proposal for this (most of a proposal's time, where the products themselves take a small share;
// docs/journal/engine.md); here they are plain loops, and the products one register-tiled kernel over weights packed
// once (fp32, or 8-bit codes where the build has the integer products, below). The result equals the Python trunk up to
// float rounding, computing from the same rounded weights and inputs for the 8-bit products
// (tests/test_native_trunk.py); a draft is a proposal the target verifies, so the output stays exact.
//
// Shape letters: B = blocks, K = slots, R = B*K rows, D = drafter width, H = heads, E = D/H head width,
// C = context positions, L = layers, I = MLP width, T = target width, N = a product's output width.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "products.h"
#include "simd.h"

#include <algorithm>
#include <vector>

namespace {

using namespace simd;

constexpr int64_t PANEL = 2 * LANES;  // output columns of a packed weight panel: two vectors
// rows of a register tile: 8 rows x 2 vectors = 16 accumulators of AVX-512's 32 registers; 3 x 2 of AVX2's 8 V16
// (the weights then come from memory as the products' operands)
constexpr int64_t ROWS = REGISTERS >= 32 ? 8 : 3;

// MR rows of x (MR, I) times one panel (I, 32) plus bias -> out (MR, cols <= 32), rows out_stride apart
template <int MR>
void tile(const float* x, int64_t in, const float* panel, const float* bias, int64_t cols, float* out,
          int64_t out_stride) {
  const int64_t high = std::max<int64_t>(cols - LANES, 0);  // columns in the second vector
  V16 acc0[MR], acc1[MR];
  const V16 bias0 = load(bias, cols), bias1 = load(bias + LANES, high);
  // every loop over the tile's rows unrolled: the accumulators then live in registers (GCC kept them on the stack,
  // stored each step, while the last loop indexed them: 2.6x slower)
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc0[r] = bias0, acc1[r] = bias1;
  for (int64_t i = 0; i < in; ++i) {
    const V16 w0 = load(panel + i * PANEL), w1 = load(panel + i * PANEL + LANES);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const V16 xi = splat(x[r * in + i]);
      acc0[r] = fma(xi, w0, acc0[r]);
      acc1[r] = fma(xi, w1, acc1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    store(out + r * out_stride, acc0[r], cols);
    store(out + r * out_stride + LANES, acc1[r], high);
  }
}

// nn.Linear's weight (N, I) -> panels (ceil(N / 32), I, 32), zero-padded: panel p holds output columns 32p.. with
// each input feature's 32 weights side by side, so a tile reads its panel once, front to back
at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "weight must be (N, I) fp32");
  const int64_t n = weight.size(0), in = weight.size(1), panels = (n + PANEL - 1) / PANEL;
  auto padded = at::zeros({panels * PANEL, in}, weight.options());  // (P*32, I)
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({panels, PANEL, in}).transpose(1, 2).contiguous();  // (P, 32, I) -> (P, I, 32)
}

struct Fp32Linear {  // a packed weight (P, I, 32) and its bias (N,)
  const at::Tensor& packed;
  const at::Tensor& bias;

  int64_t out_features() const { return bias.size(0); }

  // x (R, I) -> out (R, N); panels are split over the threads, each panel's rows in tiles of 8
  void operator()(const float* x, int64_t rows, int64_t in, float* out) const {
    const int64_t n = out_features();
    TORCH_CHECK(packed.scalar_type() == at::kFloat && packed.dim() == 3 && packed.size(2) == PANEL &&
                    packed.size(1) == in && packed.size(0) * PANEL >= n && packed.is_contiguous(),
                "fp32 weights must be packed by drafter.native_trunk.pack");
    const float* w = packed.data_ptr<float>();
    const float* b = bias.data_ptr<float>();
    at::parallel_for(0, packed.size(0), 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p)
        for (int64_t r = 0; r < rows; r += ROWS)
          with_count<ROWS>(rows - r, [&](auto mr) {
            tile<decltype(mr)::value>(x + r * in, in, w + p * in * PANEL, b + p * PANEL,
                                      std::min(PANEL, n - p * PANEL), out + r * n + p * PANEL, n);
          });
    });
  }
};

#if defined(INTEGER_PRODUCTS)
// Where the decode step multiplies 8-bit codes (products.h), so does the trunk: weights as GGUF's Q8_0 codes
// (core.runtime.cpu_linear.pack_q8_blocks, layout "bytes"), each row's inputs rounded to 8-bit codes per block of 32. On AVX2
// the fp32 products ran at ~45 GMAC/s on two cores and read 4 bytes a weight; these read one. The drafts move by the
// rounding only, and a draft is a proposal the target verifies: the output stays exact.
constexpr int Q8_ROWS = 4;  // rows sharing one pass over a block's codes (the decode step's q8 tile)

template <int R>
void q8_tile(const int32_t* tile_blocks, int64_t groups, const products::Operand* x, int64_t r0, const float* bias,
             int64_t cols, float* out, int64_t out_stride) {
  V16 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = load(bias, cols);
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t* block = tile_blocks + g * products::Q8_WORDS;
    const products::Operand* at_group[R];
    V16 dot[R];
    for (int r = 0; r < R; ++r) at_group[r] = x + (r0 + r) * groups + g;
    products::q8_dots<R>(block, at_group, dot);
    const V16 scale = products::load_half(block + products::Q8_SCALES);
    for (int r = 0; r < R; ++r) acc[r] = fma(scale, dot[r], acc[r]);
  }
  for (int r = 0; r < R; ++r) store(out + (r0 + r) * out_stride, acc[r], cols);
}

struct Q8Linear {  // packed blocks (ceil(N / 16), ceil(I / 32), 136) and the bias (N,)
  const at::Tensor& packed;
  const at::Tensor& bias;

  int64_t out_features() const { return bias.size(0); }

  // x (R, I) -> out (R, N); tiles of 16 outputs are split over the threads, each tile's rows Q8_ROWS at a time
  void operator()(const float* x, int64_t rows, int64_t in, float* out) const {
    const int64_t groups = packed.size(1), n = out_features();
    TORCH_CHECK(packed.scalar_type() == at::kInt && packed.dim() == 3 && packed.size(2) == products::Q8_WORDS &&
                    groups == (in + products::GROUP - 1) / products::GROUP && packed.size(0) * products::TILE >= n &&
                    packed.is_contiguous(), "8-bit weights must be packed by drafter.native_trunk.pack");
    const auto operands = products::quantize_rows(x, rows, in);  // (R, groups)
    const int32_t* words = packed.data_ptr<int32_t>();
    const float* b = bias.data_ptr<float>();
    at::parallel_for(0, packed.size(0), 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t r = 0; r < rows; r += Q8_ROWS)
          with_count<Q8_ROWS>(rows - r, [&](auto mr) {
            q8_tile<decltype(mr)::value>(words + t * groups * products::Q8_WORDS, groups, operands.data(), r,
                                         b + t * products::TILE, std::min(products::TILE, n - t * products::TILE),
                                         out + t * products::TILE, n);
          });
    });
  }
};
#endif

// the products the build multiplies fastest: 8-bit codes where the decode step's are (products.h), else fp32; fp32
// panels are read everywhere (drafter.native_trunk.pack packs either)
#if defined(INTEGER_PRODUCTS)
constexpr const char* PRODUCTS = "8-bit";
#else
constexpr const char* PRODUCTS = "fp32";
#endif

struct Linear {  // a weight packed either way (its dtype says which) and its bias (N,)
  const at::Tensor& packed;
  const at::Tensor& bias;

  int64_t out_features() const { return bias.size(0); }

  // x (R, I) -> out (R, N)
  void operator()(const float* x, int64_t rows, int64_t in, float* out) const {
    if (packed.scalar_type() == at::kFloat) return Fp32Linear{packed, bias}(x, rows, in, out);
#if defined(INTEGER_PRODUCTS)
    return Q8Linear{packed, bias}(x, rows, in, out);
#else
    TORCH_CHECK(false, "this build multiplies fp32 weights only (drafter.native_trunk.pack with products=\"fp32\")");
#endif
  }
};

// h (R, D) = LayerNorm(x) * (1 + scale) + shift: the norm without affine weights, then adaLN's modulation (eq. 9's
// network, network.modulate)
void norm_modulate(const float* x, int64_t rows, int64_t d, const float* shift, const float* scale, double eps,
                   float* h) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * d;
    const float mean = lane_sum(row, d, false) / static_cast<float>(d);
    V16 spread = zeros();
    for (int64_t i = 0; i < d; i += LANES) {
      const V16 centred = load(row + i, d - i) - splat(mean);
      spread = fma(centred, centred, spread);
    }
    const V16 inv = splat(1.0f / std::sqrt(sum(spread) / static_cast<float>(d) + static_cast<float>(eps)));
    for (int64_t i = 0; i < d; i += LANES) {
      const V16 normed = (load(row + i, d - i) - splat(mean)) * inv;
      store(h + r * d + i, fma(normed, splat(1.0f) + load(scale + i, d - i), load(shift + i, d - i)), d - i);
    }
  }
}

// x (R, D) += gate (D,) * y (R, D): adaLN-Zero's gated residual
void gated_add(float* x, int64_t rows, int64_t d, const float* gate, const float* y) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; i += LANES)
      store(x + r * d + i, fma(load(gate + i, d - i), load(y + r * d + i, d - i), load(x + r * d + i, d - i)), d - i);
}

// exact GELU, x * (1 + erf(x / sqrt 2)) / 2, with erf from Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)
inline V16 gelu(V16 x) {
  const V16 z = x * splat(0.70710678118654752f), a = abs(z);
  const V16 t = splat(1.0f) / fma(splat(0.3275911f), a, splat(1.0f));
  V16 poly = fma(splat(1.061405429f), t, splat(-1.453152027f));
  poly = fma(poly, t, splat(1.421413741f));
  poly = fma(poly, t, splat(-0.284496736f));
  poly = fma(poly, t, splat(0.254829592f)) * t;
  const V16 erf = copysign(splat(1.0f) - poly * exp(zeros() - a * a), z);
  return splat(0.5f) * x * (splat(1.0f) + erf);
}

void gelu_inplace(float* x, int64_t n) {
  at::parallel_for(0, (n + LANES - 1) / LANES, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * LANES; i < std::min(n, end * LANES); i += LANES) store(x + i, gelu(load(x + i, n - i)), n - i);
  });
}

// A block's MLP sub-layer, both trunks': x (R, D) += gate * (W_out gelu(W_in h + b_in) + b_out), h = x normalised and
// modulated by (shift, scale); linear_in and linear_out point at a weight followed by its bias; h, wide and y scratch
void mlp_sublayer(float* x, int64_t rows, int64_t d, const float* shift, const float* scale, const float* gate,
                  double eps, const at::Tensor* linear_in, const at::Tensor* linear_out, float* h, float* wide,
                  float* y) {
  norm_modulate(x, rows, d, shift, scale, eps, h);
  const Linear mlp_in{linear_in[0], linear_in[1]};
  mlp_in(h, rows, d, wide);
  gelu_inplace(wide, rows * mlp_in.out_features());
  Linear{linear_out[0], linear_out[1]}(wide, rows, mlp_in.out_features(), y);
  gated_add(x, rows, d, gate, y);
}

// The trunk's output: x (R, D) normalised and modulated by (shift, scale) (h: scratch), times the final linear
// (linear: its weight, then its bias) -> (R, N) fp32
at::Tensor modulated_output(const float* x, int64_t rows, int64_t d, const float* shift, const float* scale,
                            double eps, const at::Tensor* linear, float* h, const at::TensorOptions& options) {
  norm_modulate(x, rows, d, shift, scale, eps, h);
  const Linear out{linear[0], linear[1]};
  auto result = at::empty({rows, out.out_features()}, options);
  out(h, rows, d, result.data_ptr<float>());
  return result;
}

// per-head RMSNorm with weight (E,), times `scale`: n rows of E values at src, `stride` apart -> dst (n, E), or
// transposed -> dst (E, n) (keys, for `scores`)
void head_norm(const float* src, int64_t stride, int64_t n, int64_t e, const float* weight, double eps, float scale,
               float* dst, bool transposed = false) {
  float row_out[8 * LANES];  // e <= 128 (trunk checks)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = src + r * stride;
    const V16 inv = splat(scale / std::sqrt(lane_sum(row, e, true) / static_cast<float>(e) + static_cast<float>(eps)));
    float* to = transposed ? row_out : dst + r * e;
    for (int64_t i = 0; i < e; i += LANES) store(to + i, load(row + i, e - i) * inv * load(weight + i, e - i), e - i);
    if (transposed)
      for (int64_t i = 0; i < e; ++i) dst[i * n + r] = row_out[i];
  }
}

// the NV-vector group of columns c0.. of scores (Q, C) = queries (Q, E) @ keys_t (E, C) (rows kstride apart): NV
// accumulators a query, so the E-long chains of products run side by side
template <int NV>
void score_group(const float* queries, int64_t nq, const float* keys_t, int64_t nk, int64_t kstride, int64_t e,
                 int64_t c0, float* scores) {
  for (int64_t q = 0; q < nq; ++q) {
    V16 acc[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[j] = zeros();
    for (int64_t i = 0; i < e; ++i) {
      const V16 qi = splat(queries[q * e + i]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j)
        acc[j] = fma(qi, load(keys_t + i * kstride + c0 + j * LANES, nk - c0 - j * LANES), acc[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) store(scores + q * nk + c0 + j * LANES, acc[j], nk - c0 - j * LANES);
  }
}

// out (E,) += sum over c of weights[c] * values[c] (C rows of E <= 128, vstride apart): one accumulator per 16 of E,
// side by side over the keys
template <int NV>
void weighted_sum(const float* weights, int64_t nk, const float* values, int64_t vstride, int64_t e, V16 total,
                  float* out) {
  V16 acc[NV];
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) acc[j] = zeros();
  for (int64_t c = 0; c < nk; ++c) {
    const V16 w = splat(weights[c]);
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[j] = fma(w, load(values + c * vstride + j * LANES, e - j * LANES), acc[j]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) store(out + j * LANES, acc[j] / total, e - j * LANES);
}

// softmax attention of queries (Q, E) (normed and scaled) over keys_t (E, C) (normed, transposed; rows kstride apart,
// C where 0) and values (C rows of E, vstride apart) -> out (Q rows of E, ostride apart); scores is scratch
void attend(const float* queries, int64_t nq, const float* keys_t, int64_t nk, const float* values, int64_t vstride,
            int64_t e, float* out, int64_t ostride, std::vector<float>& scores, int64_t kstride = 0) {
  if (kstride == 0) kstride = nk;
  scores.resize(nq * nk);
  constexpr int64_t GROUP = 8 * LANES;  // keys scored side by side
  for (int64_t c0 = 0; c0 < nk; c0 += GROUP)
    with_count<8>((std::min(GROUP, nk - c0) + LANES - 1) / LANES, [&](auto nv) {
      score_group<decltype(nv)::value>(queries, nq, keys_t, nk, kstride, e, c0, scores.data());
    });
  for (int64_t q = 0; q < nq; ++q) {
    float* w = scores.data() + q * nk;
    V16 peak = splat(-3.0e38f);
    for (int64_t c = 0; c < nk; c += LANES) peak = max(peak, load_or(w + c, nk - c, -3.0e38f));
    const V16 shift = splat(top(peak));
    for (int64_t c = 0; c < nk; c += LANES) store(w + c, exp(load(w + c, nk - c) - shift), nk - c);
    const V16 total = splat(lane_sum(w, nk, false));
    with_count<8>((e + LANES - 1) / LANES, [&](auto nv) {
      weighted_sum<decltype(nv)::value>(w, nk, values, vstride, e, total, out + q * ostride);
    });
  }
}

struct Dims {
  int64_t blocks, slots, d, heads, e;
};

// bidirectional self-attention among each block's slots: qkv (R, 3D) = q | k | v -> out (R, D)
void self_attention(const float* qkv, const Dims& s, const float* q_norm, const float* k_norm, double eps,
                    float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.e));
  at::parallel_for(0, s.blocks * s.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(s.slots * s.e), k(s.slots * s.e), scores;  // k: (E, K) transposed
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t b = unit / s.heads, h = unit % s.heads;
      const float* rows = qkv + b * s.slots * 3 * s.d + h * s.e;
      head_norm(rows, 3 * s.d, s.slots, s.e, q_norm, eps, scale, q.data());
      head_norm(rows + s.d, 3 * s.d, s.slots, s.e, k_norm, eps, 1.0f, k.data(), true);
      attend(q.data(), s.slots, k.data(), s.slots, rows + 2 * s.d, 3 * s.d, s.e, out + b * s.slots * s.d + h * s.e,
             s.d, scores);
    }
  });
}

// cross-attention of every slot to the context: queries (R, D); keys and values are columns of maps (C, 2L*D) at
// key_col and key_col + D (the cached maps of drafter/runtime/frozen.py, shared by every block) -> out (R, D)
void cross_attention(const float* queries, const Dims& s, const at::Tensor& maps, int64_t key_col,
                     const float* q_norm, const float* k_norm, double eps, float* out) {
  const int64_t nk = maps.size(0), stride = maps.size(1);
  const float* keys_raw = maps.data_ptr<float>() + key_col;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.e));
  at::parallel_for(0, s.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(s.slots * s.e), k(nk * s.e), scores;  // k: (E, C) transposed
    for (int64_t h = begin; h < end; ++h) {
      head_norm(keys_raw + h * s.e, stride, nk, s.e, k_norm, eps, 1.0f, k.data(), true);
      for (int64_t b = 0; b < s.blocks; ++b) {
        const int64_t row0 = b * s.slots;
        head_norm(queries + row0 * s.d + h * s.e, s.d, s.slots, s.e, q_norm, eps, scale, q.data());
        attend(q.data(), s.slots, k.data(), nk, keys_raw + s.d + h * s.e, stride, s.e, out + row0 * s.d + h * s.e,
               s.d, scores);
      }
    }
  });
}

constexpr int64_t HEAD_TENSORS = 3;  // slot_in packed, slot_in bias, slot_pos (K', D)
constexpr int64_t LAYER_TENSORS = 16;  // per block, in this order:
enum Slot { QKV, QKV_BIAS, SELF_Q_NORM, SELF_K_NORM, SELF_O, SELF_O_BIAS, CROSS_Q, CROSS_Q_BIAS, CROSS_Q_NORM,
            CROSS_K_NORM, CROSS_O, CROSS_O_BIAS, MLP_IN, MLP_IN_BIAS, MLP_OUT, MLP_OUT_BIAS };
constexpr int64_t TAIL_TENSORS = 2;  // out packed, out bias

// slot_input (R, T) of B blocks of K slots -> the trunk's output (R, T). maps (C, 2L*D): each block's cross-attention
// keys and values over the context (k0 | v0 | k1 | v1 ...); mods (9L + 2, D): each block's adaLN shift, scale and
// gate of its three sub-layers, then the output's shift and scale; weights: HEAD_TENSORS, LAYER_TENSORS per block
// (linears packed by `pack`), TAIL_TENSORS.
at::Tensor trunk(const at::Tensor& slot_input, int64_t slots, const at::Tensor& maps, const at::Tensor& mods,
                 const std::vector<at::Tensor>& weights, int64_t heads, double ln_eps, double qk_eps) {
  const int64_t layers = (static_cast<int64_t>(weights.size()) - HEAD_TENSORS - TAIL_TENSORS) / LAYER_TENSORS;
  TORCH_CHECK(layers >= 1 && HEAD_TENSORS + layers * LAYER_TENSORS + TAIL_TENSORS == static_cast<int64_t>(weights.size()),
              "expected ", HEAD_TENSORS, " + ", LAYER_TENSORS, " per block + ", TAIL_TENSORS, " weight tensors");
  for (const auto& w : weights) TORCH_CHECK(w.is_contiguous(), "weights must be contiguous");
  TORCH_CHECK(slot_input.dim() == 2 && slot_input.scalar_type() == at::kFloat && slot_input.is_contiguous(),
              "slot_input must be (R, T) contiguous fp32");
  const int64_t rows = slot_input.size(0), d = weights[1].size(0);
  TORCH_CHECK(slots >= 1 && rows % slots == 0 && slots <= weights[2].size(0), "rows must be whole blocks of slots");
  TORCH_CHECK(maps.dim() == 2 && maps.size(1) == 2 * layers * d && maps.scalar_type() == at::kFloat &&
              maps.is_contiguous(), "maps must be (C, 2L*D) contiguous fp32");
  TORCH_CHECK(mods.dim() == 2 && mods.size(0) == 9 * layers + 2 && mods.size(1) == d && mods.is_contiguous(),
              "mods must be (9L + 2, D)");
  TORCH_CHECK(heads >= 1 && d % heads == 0 && d / heads <= 8 * LANES, "heads must divide the width, at most 128 a head");
  const Dims s{rows / slots, slots, d, heads, d / heads};
  const float* m = mods.data_ptr<float>();

  int64_t widest = 3 * d;  // the qkv product's or the widest MLP's
  for (int64_t l = 0; l < layers; ++l)
    widest = std::max(widest, weights[HEAD_TENSORS + l * LAYER_TENSORS + MLP_IN_BIAS].size(0));
  std::vector<float> x(rows * d), h(rows * d), mixed(rows * d), y(rows * d), wide(rows * widest);
  Linear{weights[0], weights[1]}(slot_input.data_ptr<float>(), rows, slot_input.size(1), x.data());
  const float* pos = weights[2].data_ptr<float>();  // by slot
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; ++i) x[r * d + i] += pos[(r % slots) * d + i];

  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + HEAD_TENSORS + l * LAYER_TENSORS;
    const float* lm = m + 9 * l * d;  // this block's 9 modulation rows
    // self-attention among the slots
    norm_modulate(x.data(), rows, d, lm, lm + d, ln_eps, h.data());
    Linear{w[QKV], w[QKV_BIAS]}(h.data(), rows, d, wide.data());
    self_attention(wide.data(), s, w[SELF_Q_NORM].data_ptr<float>(), w[SELF_K_NORM].data_ptr<float>(), qk_eps,
                   mixed.data());
    Linear{w[SELF_O], w[SELF_O_BIAS]}(mixed.data(), rows, d, y.data());
    gated_add(x.data(), rows, d, lm + 2 * d, y.data());
    // cross-attention to the context
    norm_modulate(x.data(), rows, d, lm + 3 * d, lm + 4 * d, ln_eps, h.data());
    Linear{w[CROSS_Q], w[CROSS_Q_BIAS]}(h.data(), rows, d, y.data());
    cross_attention(y.data(), s, maps, 2 * l * d, w[CROSS_Q_NORM].data_ptr<float>(), w[CROSS_K_NORM].data_ptr<float>(),
                    qk_eps, mixed.data());
    Linear{w[CROSS_O], w[CROSS_O_BIAS]}(mixed.data(), rows, d, y.data());
    gated_add(x.data(), rows, d, lm + 5 * d, y.data());
    mlp_sublayer(x.data(), rows, d, lm + 6 * d, lm + 7 * d, lm + 8 * d, ln_eps, w + MLP_IN, w + MLP_OUT, h.data(),
                 wide.data(), y.data());
  }
  const at::Tensor* tail = weights.data() + HEAD_TENSORS + layers * LAYER_TENSORS;
  return modulated_output(x.data(), rows, d, m + 9 * layers * d, m + (9 * layers + 1) * d, ln_eps, tail, h.data(),
                          slot_input.options());  // (R, T)
}

// ---- the released FlashMap DiT (drafter/networks/release.py ReleaseNet) ----------------------------------------------
// Where it differs from the trunk above: no slot embedding, queries and keys rotated by position (RoPE on interleaved
// channel pairs) after their per-head RMSNorm, adaLN rows ordered (scale, shift, gate), and the context's keys and
// values kept by the caller, already normed and rotated: per layer keys_t (H, E, capacity) and values (H, capacity, E),
// of which the first `context` positions are read.

// per-head RMSNorm with weight (E,), times `scale`, then each pair (x[2i], x[2i + 1]) rotated by its row's angle
// (cos, sin (n, E/2)): n rows of E values at src, `stride` apart -> dst (n, E), or transposed -> dst (E, n)
void head_norm_rotate(const float* src, int64_t stride, int64_t n, int64_t e, const float* weight, double eps,
                      float scale, const float* cos, const float* sin, float* dst, bool transposed = false) {
  float normed[8 * LANES], rotated[8 * LANES];  // e <= 128 (release_trunk checks)
  const int64_t half = e / 2;
  for (int64_t r = 0; r < n; ++r) {
    head_norm(src + r * stride, stride, 1, e, weight, eps, scale, normed);
    const float* c = cos + r * half;
    const float* s = sin + r * half;
    for (int64_t i = 0; i < half; ++i) {
      const float even = normed[2 * i], odd = normed[2 * i + 1];
      rotated[2 * i] = even * c[i] - odd * s[i];
      rotated[2 * i + 1] = odd * c[i] + even * s[i];
    }
    if (transposed)
      for (int64_t i = 0; i < e; ++i) dst[i * n + r] = rotated[i];
    else
      std::copy(rotated, rotated + e, dst + r * e);
  }
}

constexpr int64_t RELEASE_HEAD_TENSORS = 2;  // x_embed packed, its bias
constexpr int64_t RELEASE_LAYER_TENSORS = 15;  // per layer, in this order:
enum ReleaseSlot { R_QKV, R_QKV_BIAS, R_SELF_Q_NORM, R_SELF_K_NORM, R_SELF_O, R_SELF_O_BIAS, R_CROSS_Q, R_CROSS_Q_BIAS,
                   R_CROSS_Q_NORM, R_CROSS_O, R_CROSS_O_BIAS, R_MLP_IN, R_MLP_IN_BIAS, R_MLP_OUT, R_MLP_OUT_BIAS };
constexpr int64_t RELEASE_TAIL_TENSORS = 2;  // head packed, its bias

// inputs (K, T): one block's slots (the state's embedding, mixed) -> the DiT's output (K, T). cos, sin (K, E/2): the
// slots' rotary angles; keys_t, values: per layer the context (above), `context` positions of each read; mods
// (9L + 2, D): per layer the self-attention's, cross-attention's and MLP's adaLN scale, shift, gate, then the final
// norm's scale and shift; weights: RELEASE_HEAD_TENSORS, RELEASE_LAYER_TENSORS per layer, RELEASE_TAIL_TENSORS.
at::Tensor release_trunk(const at::Tensor& inputs, const at::Tensor& cos, const at::Tensor& sin,
                         const std::vector<at::Tensor>& keys_t, const std::vector<at::Tensor>& values, int64_t context,
                         const at::Tensor& mods, const std::vector<at::Tensor>& weights, int64_t heads, double ln_eps,
                         double qk_eps) {
  const int64_t layers = static_cast<int64_t>(keys_t.size());
  TORCH_CHECK(layers >= 1 && static_cast<int64_t>(values.size()) == layers &&
                  RELEASE_HEAD_TENSORS + layers * RELEASE_LAYER_TENSORS + RELEASE_TAIL_TENSORS ==
                      static_cast<int64_t>(weights.size()),
              "expected keys and values per layer and ", RELEASE_HEAD_TENSORS, " + ", RELEASE_LAYER_TENSORS,
              " per layer + ", RELEASE_TAIL_TENSORS, " weight tensors");
  for (const auto& w : weights) TORCH_CHECK(w.is_contiguous(), "weights must be contiguous");
  TORCH_CHECK(inputs.dim() == 2 && inputs.scalar_type() == at::kFloat && inputs.is_contiguous(),
              "inputs must be (K, T) contiguous fp32");
  const int64_t slots = inputs.size(0), d = weights[1].size(0);
  TORCH_CHECK(heads >= 1 && d % heads == 0 && d / heads <= 8 * LANES && (d / heads) % 2 == 0,
              "heads must divide the width into even heads of at most 128");
  const int64_t e = d / heads;
  for (const auto* t : {&cos, &sin})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == slots && t->size(1) == e / 2 && t->scalar_type() == at::kFloat &&
                    t->is_contiguous(), "cos and sin must be (K, E/2) contiguous fp32");
  const int64_t capacity = keys_t[0].size(2);
  TORCH_CHECK(context >= 1 && context <= capacity, "context must be 1 .. the buffers' capacity");
  for (int64_t l = 0; l < layers; ++l)
    TORCH_CHECK(keys_t[l].dim() == 3 && keys_t[l].size(0) == heads && keys_t[l].size(1) == e &&
                    keys_t[l].size(2) == capacity && keys_t[l].scalar_type() == at::kFloat &&
                    keys_t[l].is_contiguous() && values[l].dim() == 3 && values[l].size(0) == heads &&
                    values[l].size(1) == capacity && values[l].size(2) == e &&
                    values[l].scalar_type() == at::kFloat && values[l].is_contiguous(),
                "keys_t must be (H, E, capacity) and values (H, capacity, E), contiguous fp32");
  TORCH_CHECK(mods.dim() == 2 && mods.size(0) == 9 * layers + 2 && mods.size(1) == d &&
              mods.scalar_type() == at::kFloat && mods.is_contiguous(), "mods must be (9L + 2, D) fp32");
  const float* m = mods.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(e));

  int64_t widest = 3 * d;
  for (int64_t l = 0; l < layers; ++l)
    widest = std::max(widest, weights[RELEASE_HEAD_TENSORS + l * RELEASE_LAYER_TENSORS + R_MLP_IN_BIAS].size(0));
  std::vector<float> x(slots * d), h(slots * d), mixed(slots * d), y(slots * d), wide(slots * widest);
  Linear{weights[0], weights[1]}(inputs.data_ptr<float>(), slots, inputs.size(1), x.data());

  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor* w = weights.data() + RELEASE_HEAD_TENSORS + l * RELEASE_LAYER_TENSORS;
    const float* lm = m + 9 * l * d;  // scale, shift, gate of the self-attention, the cross-attention, the MLP
    // self-attention among the slots
    norm_modulate(x.data(), slots, d, lm + d, lm, ln_eps, h.data());
    Linear{w[R_QKV], w[R_QKV_BIAS]}(h.data(), slots, d, wide.data());
    at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> q(slots * e), k(slots * e), scores;  // k: (E, K) transposed
      for (int64_t hd = begin; hd < end; ++hd) {
        const float* rows = wide.data() + hd * e;
        head_norm_rotate(rows, 3 * d, slots, e, w[R_SELF_Q_NORM].data_ptr<float>(), qk_eps, scale, c, s, q.data());
        head_norm_rotate(rows + d, 3 * d, slots, e, w[R_SELF_K_NORM].data_ptr<float>(), qk_eps, 1.0f, c, s, k.data(),
                         true);
        attend(q.data(), slots, k.data(), slots, rows + 2 * d, 3 * d, e, mixed.data() + hd * e, d, scores);
      }
    });
    Linear{w[R_SELF_O], w[R_SELF_O_BIAS]}(mixed.data(), slots, d, y.data());
    gated_add(x.data(), slots, d, lm + 2 * d, y.data());
    // cross-attention to the context
    norm_modulate(x.data(), slots, d, lm + 4 * d, lm + 3 * d, ln_eps, h.data());
    Linear{w[R_CROSS_Q], w[R_CROSS_Q_BIAS]}(h.data(), slots, d, y.data());
    const float* keys = keys_t[l].data_ptr<float>();
    const float* vals = values[l].data_ptr<float>();
    at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> q(slots * e), scores;
      for (int64_t hd = begin; hd < end; ++hd) {
        head_norm_rotate(y.data() + hd * e, d, slots, e, w[R_CROSS_Q_NORM].data_ptr<float>(), qk_eps, scale, c, s,
                         q.data());
        attend(q.data(), slots, keys + hd * e * capacity, context, vals + hd * capacity * e, e, e,
               mixed.data() + hd * e, d, scores, capacity);
      }
    });
    Linear{w[R_CROSS_O], w[R_CROSS_O_BIAS]}(mixed.data(), slots, d, y.data());
    gated_add(x.data(), slots, d, lm + 5 * d, y.data());
    mlp_sublayer(x.data(), slots, d, lm + 7 * d, lm + 6 * d, lm + 8 * d, ln_eps, w + R_MLP_IN, w + R_MLP_OUT,
                 h.data(), wide.data(), y.data());
  }
  const at::Tensor* tail = weights.data() + RELEASE_HEAD_TENSORS + layers * RELEASE_LAYER_TENSORS;
  return modulated_output(x.data(), slots, d, m + (9 * layers + 1) * d, m + 9 * layers * d, ln_eps, tail, h.data(),
                          inputs.options());  // (K, T)
}

// x (R, I) @ W^T + bias -> (R, N) for a weight packed by `pack` (the LM head rows, and tests of the kernel)
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be (R, I) contiguous fp32");
  TORCH_CHECK(bias.dim() == 1 && bias.scalar_type() == at::kFloat && bias.is_contiguous(), "bias must be (N,) fp32");
  auto out = at::empty({x.size(0), bias.size(0)}, x.options());
  Linear{packed, bias}(x.data_ptr<float>(), x.size(0), x.size(1), out.data_ptr<float>());
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "an nn.Linear weight (N, I) packed for the trunk's fp32 products");
  m.def("linear", &linear, "x @ W^T + bias for a packed weight");
  m.def("trunk", &trunk, "the DiT drafter's trunk at one time pair");
  m.def("release_trunk", &release_trunk, "the released FlashMap DiT at one jump, one block");
  m.attr("LAYER_TENSORS") = LAYER_TENSORS;
  m.attr("PRODUCTS") = PRODUCTS;  // the fastest products here: "fp32", or "8-bit" codes (drafter.native_trunk.pack)
}
