// Choosing tokens from a CPU forward's logits, one pass or two over each row instead of torch's chain of whole-row ops:
// core/verification/sampling.py calls these where core/runtime/native.py could build them, torch's ops elsewhere. A
// decode step of the embedded default reads 49,152 logits a row, where torch's whole-row ops cost tens of microseconds
// each and these passes a few (docs/journal/engine.md, "Measurements behind the code's rules").
//
// Shape letters: R = rows, V = vocabulary.
#include <torch/extension.h>

#include "simd.h"

#include <cmath>
#include <tuple>
#include <vector>
#include <pybind11/stl.h>

namespace {

using namespace simd;

// exp() in simd.h clamps its argument at -87 (its value there, ~1.6e-38, is the least it returns): softmax counts a
// token whose exponent is that far below the maximum as probability 0, as a float softmax does from ~104 below (and
// exactly for -inf, a masked logit)
constexpr float LOWEST_EXPONENT = -87.0f;
constexpr int64_t BLOCK = 64;  // values a pass reduces together (a multiple of LANES)

inline V16 load_or_lowest(const float* x, int64_t n) { return load_or(x, n, -INFINITY); }

inline V16 load_or_lowest(const bf16* x, int64_t n) {
  if (n >= LANES) return load(x);
  float tail[LANES];
  for (int64_t l = 0; l < LANES; ++l) tail[l] = l < n ? static_cast<float>(x[l]) : -INFINITY;
  return load(tail);
}

// the largest value of x[start, end)
template <typename T>
float span_max(const T* x, int64_t start, int64_t end) {
  V16 acc = splat(-INFINITY);
  for (int64_t i = start; i < end; i += LANES) acc = max(acc, load_or_lowest(x + i, end - i));
  return top(acc);
}

// the first index of the row's largest value, as torch.argmax finds it in a NaN-free row: the blocks' maxima, then
// a scan of the first block that holds the largest
template <typename T>
int64_t row_argmax(const T* x, int64_t n) {
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
  std::vector<float> block_max(blocks);
  float best = -INFINITY;
  for (int64_t b = 0; b < blocks; ++b) {
    block_max[b] = span_max(x, b * BLOCK, std::min(n, (b + 1) * BLOCK));
    best = std::max(best, block_max[b]);
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if (block_max[b] != best) continue;
    for (int64_t i = b * BLOCK; i < std::min(n, (b + 1) * BLOCK); ++i)
      if (static_cast<float>(x[i]) == best) return i;
  }
  return 0;  // a row of NaNs only
}

// softmax(x * inv_temperature) of one row into out (n,) fp32
template <typename T>
void row_softmax(const T* x, int64_t n, float inv_temperature, float* __restrict out) {
  const float shift = span_max(x, 0, n) * inv_temperature;
  const V16 scale = splat(inv_temperature), minus = splat(-shift);
  const int64_t full = n - n % LANES;
  V16 acc = zeros();
  for (int64_t i = 0; i < full; i += LANES) {
    const V16 e = exp(fma(load(x + i), scale, minus));
    store(out + i, e);
    acc = acc + e;
  }
  double total = sum(acc);
  if (full < n) {
    store(out + full, exp(fma(load(x + full, n - full), scale, minus)), n - full);
    for (int64_t i = full; i < n; ++i) total += out[i];
  }
  float least[LANES];
  store(least, exp(splat(LOWEST_EXPONENT)));
  const float floor_value = least[0], inv_total = static_cast<float>(1.0 / total);
  for (int64_t i = 0; i < n; ++i) out[i] *= out[i] > floor_value ? inv_total : 0.0f;  // a select: vectorised
}

// p[start, end) summed in float64, `excluded` counted as 0: eight running sums (lane i % 8) added in a fixed tree;
// a whole block without the excluded token runs without checks (vectorised)
double span_sum(const float* __restrict p, int64_t start, int64_t end, int64_t excluded) {
  double lanes[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  if (end - start == BLOCK && (excluded < start || excluded >= end)) {
    for (int64_t i = start; i < end; i += 8)
      for (int64_t l = 0; l < 8; ++l) lanes[l] += static_cast<double>(p[i + l]);
  } else {
    for (int64_t i = start; i < end; ++i) lanes[(i - start) % 8] += i == excluded ? 0.0 : static_cast<double>(p[i]);
  }
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

// the token whose step of the cumulative distribution holds u * (the row's total), `excluded` counted as 0 (-1:
// none): the blocks' sums in float64, the running sum over whole blocks, then token by token within the block that
// holds the goal (the running sum adds the blocks in the order the total did, so the goal, below the total, lies in a
// block with mass). A token of probability 0 is never drawn (its step is empty); where the token-by-token sum rounds
// below the block's, the block's last token with mass is drawn; a row without mass draws the last token.
int64_t row_sample(const float* p, int64_t n, double u, int64_t excluded) {
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
  std::vector<double> block_sums(blocks);
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) total += block_sums[b] = span_sum(p, b * BLOCK, std::min(n, (b + 1) * BLOCK), excluded);
  const double goal = u * total;
  double before = 0.0;
  int64_t b = 0;
  for (; b < blocks - 1 && (block_sums[b] == 0.0 || before + block_sums[b] <= goal); ++b) before += block_sums[b];
  int64_t last = -1;
  for (int64_t i = b * BLOCK; i < std::min(n, (b + 1) * BLOCK); ++i) {
    if (i == excluded || p[i] <= 0.0f) continue;
    last = i;
    before += p[i];
    if (before > goal) return i;
  }
  return last >= 0 ? last : n - 1;
}

template <typename F>
void for_each_dtype(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kBFloat16) f(x.data_ptr<bf16>());
  else f(x.data_ptr<float>());
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && x.size(1) > 0, name,
              " must be a contiguous (R, V) CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, name, " must be bf16 or fp32");
}

// a Python list, not a tensor: the engine compares them with drafted ids, and a tensor's tolist() after a forward
// is dear (every op's code comes back from memory then; docs/journal/engine.md)
std::vector<int64_t> argmax_rows(const at::Tensor& given) {
  const at::Tensor logits = given.contiguous();  // itself where it is (a forward's logits are)
  check_rows(logits, "logits");
  const int64_t rows = logits.size(0), n = logits.size(1);
  std::vector<int64_t> out(rows);
  for_each_dtype(logits, [&](auto* x) { for (int64_t r = 0; r < rows; ++r) out[r] = row_argmax(x + r * n, n); });
  return out;
}

// each row's first largest value and its probability under softmax(row) (the draft's confidence at T = 0): the
// argmax's pass, then one pass summing exp(x - max) -> (R ids, (R,) fp32 probabilities)
std::tuple<std::vector<int64_t>, at::Tensor> top_probs(const at::Tensor& given) {
  const at::Tensor logits = given.contiguous();
  check_rows(logits, "logits");
  const int64_t rows = logits.size(0), n = logits.size(1), full = n - n % LANES;
  std::vector<int64_t> ids(rows);
  auto probs = at::empty({rows}, logits.options().dtype(at::kFloat));
  auto* out = probs.data_ptr<float>();
  for_each_dtype(logits, [&](auto* x) {
    for (int64_t r = 0; r < rows; ++r) {
      const auto* row = x + r * n;
      ids[r] = row_argmax(row, n);
      const V16 minus = splat(-static_cast<float>(row[ids[r]]));
      V16 acc = zeros();
      for (int64_t i = 0; i < full; i += LANES) acc = acc + exp(load(row + i) + minus);
      double total = sum(acc);
      for (int64_t i = full; i < n; ++i) total += std::exp(static_cast<double>(row[i]) - static_cast<double>(row[ids[r]]));
      out[r] = static_cast<float>(1.0 / total);
    }
  });
  return {ids, probs};
}

at::Tensor softmax_rows(const at::Tensor& logits, double inv_temperature) {
  check_rows(logits, "logits");
  TORCH_CHECK(inv_temperature > 0, "inv_temperature must be > 0");
  const int64_t rows = logits.size(0), n = logits.size(1);
  auto out = at::empty({rows, n}, logits.options().dtype(at::kFloat));
  auto* o = out.data_ptr<float>();
  const float scale = static_cast<float>(inv_temperature);
  for_each_dtype(logits, [&](auto* x) { for (int64_t r = 0; r < rows; ++r) row_softmax(x + r * n, n, scale, o + r * n); });
  return out;
}

at::Tensor sample_rows(const at::Tensor& probs, const at::Tensor& uniforms, const std::vector<int64_t>& excluded) {
  check_rows(probs, "probs");
  TORCH_CHECK(probs.scalar_type() == at::kFloat, "probs must be fp32");
  const int64_t rows = probs.size(0), n = probs.size(1);
  TORCH_CHECK(uniforms.scalar_type() == at::kDouble && uniforms.numel() == rows && uniforms.is_contiguous(),
              "uniforms must be (R,) float64");
  TORCH_CHECK(excluded.empty() || static_cast<int64_t>(excluded.size()) == rows, "excluded must hold R ids or none");
  auto out = at::empty({rows}, probs.options().dtype(at::kLong));
  const float* p = probs.data_ptr<float>();
  const double* u = uniforms.data_ptr<double>();
  auto* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) o[r] = row_sample(p + r * n, n, u[r], excluded.empty() ? -1 : excluded[r]);
  return out;
}

// Rejection sampling of a deterministic draft (q = the one-hot of each drafted token: a copied draft) at a temperature,
// from its rows of logits (K + 1, V) and 2K + 1 uniforms: slot k's token is kept with probability p_k(token)
// (u[2k] < p), the first rejected one is replaced by a draw from p_k without it (u[2k + 1]), and when every slot is
// kept the target's token is drawn from p_K (u[2K]). A row's softmax is computed only once its slot is reached (at
// T > 0 most drafts end at their first). -> (tokens kept, the target's token)
std::tuple<int64_t, int64_t> verify_copy(const at::Tensor& given, const std::vector<int64_t>& drafted,
                                         double inv_temperature, const at::Tensor& uniforms) {
  const at::Tensor logits = given.contiguous();
  check_rows(logits, "logits");
  const int64_t slots = static_cast<int64_t>(drafted.size()), n = logits.size(1);
  TORCH_CHECK(logits.size(0) == slots + 1 && inv_temperature > 0, "K + 1 rows of logits and inv_temperature > 0");
  TORCH_CHECK(uniforms.scalar_type() == at::kDouble && uniforms.numel() == 2 * slots + 1 && uniforms.is_contiguous(),
              "uniforms must be (2K + 1,) float64");
  const double* u = uniforms.data_ptr<double>();
  thread_local std::vector<float> probs;
  probs.resize(n);
  auto row = [&](int64_t slot) {
    for_each_dtype(logits, [&](auto* x) { row_softmax(x + slot * n, n, static_cast<float>(inv_temperature), probs.data()); });
  };
  for (int64_t k = 0; k < slots; ++k) {
    TORCH_CHECK(0 <= drafted[k] && drafted[k] < n, "drafted id ", drafted[k], " is outside the vocabulary");
    row(k);
    if (u[2 * k] < probs[drafted[k]]) continue;
    return {k, row_sample(probs.data(), n, u[2 * k + 1], drafted[k])};
  }
  row(slots);
  return {slots, row_sample(probs.data(), n, u[2 * slots], -1)};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("argmax_rows", &argmax_rows, "logits (R, V) bf16/fp32 -> R ids, each row's first largest value");
  m.def("verify_copy", &verify_copy, "logits (K + 1, V), K drafted ids, inv_temperature, uniforms (2K + 1,) f64 -> "
        "(kept, next id): rejection sampling of a deterministic draft");
  m.def("top_probs", &top_probs, "logits (R, V) bf16/fp32 -> (R ids, (R,) fp32): each row's argmax and its "
        "softmax probability");
  m.def("softmax_rows", &softmax_rows, "softmax(logits * inv_temperature) of each row (R, V) -> (R, V) fp32");
  m.def("sample_rows", &sample_rows, "probs (R, V) fp32, uniforms (R,) f64, excluded: R ids (-1: none) or [] -> (R,) int64");
}
