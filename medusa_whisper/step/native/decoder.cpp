// A decoder pass's layers in one call: whisper's residual blocks over a pass's few rows, on rows.cpp's
// products and attention, with the layer norms, GELU, residual sums and cache writes between them
// written here. A one-row int8 pass made about 300 calls through PyTorch for these, and their
// dispatch cost several times the bytes the pass reads; here a pass is one call.
//
// A row's result is still its own whatever rows, batch items, threads or instruction set it is
// computed with: the products and attention are rows.cpp's, and the rest works on one row at a time,
// with every sum in one fixed order (16 lanes, then rows::tree_sum), written lane by lane in plain
// C++ and compiled for each instruction set with the same operations (-ffp-contract=off).
#include "rows.h"

#include <vector>

namespace {

using rows::GROUP;

// A linear layer as rows.cpp packed it: int8 (packed, column sums, scales, bias) or float32 (packed,
// bias). A bias of no elements is none.
struct Linear {
  bool int8 = false;
  torch::Tensor packed, colsum, scale, bias;
  int64_t n = 0, k = 0;

  void operator()(const float* x, int64_t m, float* y) const {
    const float* b = bias.numel() ? bias.data_ptr<float>() : nullptr;
    if (int8)
      rows::int8_product(x, m, k, packed.data_ptr<int8_t>(), colsum.data_ptr<int32_t>(), packed.size(0),
                         packed.size(1), scale.data_ptr<float>(), b, n, y);
    else
      rows::float_product(x, m, k, packed.data_ptr<float>(), packed.size(0), b, n, y);
  }
};

Linear linear_of(const std::vector<torch::Tensor>& parts, int64_t n, int64_t k) {
  Linear out;
  out.n = n;
  out.k = k;
  if (parts.size() == 4) {
    out.int8 = true;
    out.packed = parts[0];
    out.colsum = parts[1];
    out.scale = parts[2].contiguous();
    out.bias = parts[3].contiguous();
    TORCH_CHECK(out.packed.scalar_type() == torch::kChar && out.packed.dim() == 4 && out.packed.size(2) == GROUP &&
                    out.packed.size(0) * GROUP >= n && out.packed.size(1) == (k + 3) / 4 &&
                    out.scale.scalar_type() == torch::kFloat && out.scale.numel() == n,
                "Decoder: an int8 linear not packed by pack_int8 for its shape");
  } else {
    TORCH_CHECK(parts.size() == 2, "Decoder: a linear is (packed, colsum, scale, bias) or (packed, bias)");
    out.packed = parts[0];
    out.bias = parts[1].contiguous();
    TORCH_CHECK(out.packed.scalar_type() == torch::kFloat && out.packed.dim() == 3 && out.packed.size(2) == GROUP &&
                    out.packed.size(0) * GROUP >= n && out.packed.size(1) == k,
                "Decoder: a float32 linear not packed by pack_float for its shape");
  }
  TORCH_CHECK(out.bias.numel() == 0 || (out.bias.scalar_type() == torch::kFloat && out.bias.numel() == n),
              "Decoder: a bias of the wrong size or dtype");
  return out;
}

struct Norm {
  torch::Tensor weight, bias;
  float eps = 1e-5f;
};

// One row's layer norm: its mean and variance summed in 16 lanes and then rows::tree_sum.
__attribute__((always_inline)) inline void norm_row_body(const float* x, int64_t n, const float* w, const float* b,
                                                         float eps, float* y) {
  float lanes[rows::LANES] = {0.f};
  const int64_t whole = n / rows::LANES * rows::LANES;
  for (int64_t j = 0; j < whole; j += rows::LANES)
    for (int l = 0; l < rows::LANES; ++l) lanes[l] = lanes[l] + x[j + l];
  float total = rows::tree_sum(lanes);
  for (int64_t j = whole; j < n; ++j) total = total + x[j];
  const float mean = total / static_cast<float>(n);
  for (int l = 0; l < rows::LANES; ++l) lanes[l] = 0.f;
  for (int64_t j = 0; j < whole; j += rows::LANES)
    for (int l = 0; l < rows::LANES; ++l) {
      const float c = x[j + l] - mean;
      lanes[l] = lanes[l] + c * c;
    }
  float squares = rows::tree_sum(lanes);
  for (int64_t j = whole; j < n; ++j) squares = squares + (x[j] - mean) * (x[j] - mean);
  const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - mean) * inverse * w[j] + b[j];
}

// erf by Abramowitz and Stegun's 7.1.26 (error below 1.5e-7), on rows::exp_lane: PyTorch's vectorised
// GELU approximates erf the same way.
__attribute__((always_inline)) inline float erf_lane(float x) {
  const float a = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float r = 1.061405429f;
  r = r * t + -1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t + -0.284496736f;
  r = r * t + 0.254829592f;
  const float y = 1.0f - r * t * rows::exp_lane(-(a * a));
  return x < 0.f ? -y : y;
}

// whisper's GELU (erf's, not tanh's), in place
__attribute__((always_inline)) inline void gelu_body(float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] = 0.5f * x[j] * (1.0f + erf_lane(x[j] * 0.70710678118654752f));
}

// The same code compiled for each instruction set, taken as rows.cpp's kernels are (set_isa): with
// -ffp-contract=off each lane makes the same operations whatever the vectors' width.
__attribute__((target("avx512f"))) void norm_row_avx512(const float* x, int64_t n, const float* w, const float* b,
                                                        float eps, float* y) { norm_row_body(x, n, w, b, eps, y); }
__attribute__((target("avx2,fma"))) void norm_row_avx2(const float* x, int64_t n, const float* w, const float* b,
                                                       float eps, float* y) { norm_row_body(x, n, w, b, eps, y); }
void norm_row_plain(const float* x, int64_t n, const float* w, const float* b, float eps, float* y) {
  norm_row_body(x, n, w, b, eps, y);
}
void gelu_plain(float* x, int64_t n) { gelu_body(x, n); }

// gelu_body's operations in its order, 16 lanes at a time (the compiler does not vectorise its selects)
__attribute__((target("avx512f"))) void gelu_avx512(float* x, int64_t n) {
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    const __m512 arg = _mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f));
    const __m512 a = _mm512_abs_ps(arg);
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f),
                                                                     _mm512_mul_ps(_mm512_set1_ps(0.3275911f), a)));
    __m512 r = _mm512_set1_ps(1.061405429f);
    r = _mm512_add_ps(_mm512_mul_ps(r, t), _mm512_set1_ps(-1.453152027f));
    r = _mm512_add_ps(_mm512_mul_ps(r, t), _mm512_set1_ps(1.421413741f));
    r = _mm512_add_ps(_mm512_mul_ps(r, t), _mm512_set1_ps(-0.284496736f));
    r = _mm512_add_ps(_mm512_mul_ps(r, t), _mm512_set1_ps(0.254829592f));
    const __m512 power = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(a, a)), sign));
    const __m512 e = rows::exp16(power, _mm512_cmp_ps_mask(power, _mm512_set1_ps(-87.0f), _CMP_LT_OQ));
    const __m512 y = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(_mm512_mul_ps(r, t), e));
    const __m512 minus_y = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(y), sign));
    const __m512 erf = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(arg, _mm512_setzero_ps(), _CMP_LT_OQ), y, minus_y);
    _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v),
                                          _mm512_add_ps(_mm512_set1_ps(1.0f), erf)));
  }
  gelu_body(x + j, n - j);
}

// the same in AVX2 registers, 8 lanes at a time
__attribute__((target("avx2,fma"))) void gelu_avx2(float* x, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const __m256 arg = _mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f));
    const __m256 a = _mm256_andnot_ps(sign, arg);
    const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f),
                                                                     _mm256_mul_ps(_mm256_set1_ps(0.3275911f), a)));
    __m256 r = _mm256_set1_ps(1.061405429f);
    r = _mm256_add_ps(_mm256_mul_ps(r, t), _mm256_set1_ps(-1.453152027f));
    r = _mm256_add_ps(_mm256_mul_ps(r, t), _mm256_set1_ps(1.421413741f));
    r = _mm256_add_ps(_mm256_mul_ps(r, t), _mm256_set1_ps(-0.284496736f));
    r = _mm256_add_ps(_mm256_mul_ps(r, t), _mm256_set1_ps(0.254829592f));
    const __m256 power = _mm256_xor_ps(_mm256_mul_ps(a, a), sign);
    const __m256 e = rows::exp8(power, _mm256_cmp_ps(power, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
    const __m256 y = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(_mm256_mul_ps(r, t), e));
    const __m256 erf = _mm256_blendv_ps(y, _mm256_xor_ps(y, sign), _mm256_cmp_ps(arg, _mm256_setzero_ps(), _CMP_LT_OQ));
    _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), erf)));
  }
  gelu_body(x + j, n - j);
}

void norm_rows(const Norm& norm, const float* x, int64_t m, int64_t n, float* y) {
  const float* w = norm.weight.data_ptr<float>();
  const float* b = norm.bias.data_ptr<float>();
  const int isa = rows::isa_in_use();
  for (int64_t r = 0; r < m; ++r) {
    if (isa == 2)
      norm_row_avx512(x + r * n, n, w, b, norm.eps, y + r * n);
    else if (isa == 1)
      norm_row_avx2(x + r * n, n, w, b, norm.eps, y + r * n);
    else
      norm_row_plain(x + r * n, n, w, b, norm.eps, y + r * n);
  }
}

void gelu(float* x, int64_t n) {
  const int isa = rows::isa_in_use();
  if (isa == 2)
    gelu_avx512(x, n);
  else if (isa == 1)
    gelu_avx2(x, n);
  else
    gelu_plain(x, n);
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] + y[j];
}

struct Layer {
  Norm attn_ln, cross_ln, mlp_ln;
  std::vector<Linear> qkv;  // one product for the three, or query, key and value
  Linear out, cross_query, cross_out, fc1, fc2;
};

// whisper's decoder blocks and final norm, made once per model from the packed weights
class Decoder {
 public:
  // per layer: norms [attn_ln w, b, cross_ln w, b, mlp_ln w, b]; linears [qkv (1 or 3), out,
  // cross query, cross out, fc1, fc2], each a rows.cpp form; then the final norm
  Decoder(int64_t n_head, int64_t n_state, std::vector<std::vector<torch::Tensor>> norms,
          std::vector<std::vector<std::vector<torch::Tensor>>> linears, std::vector<torch::Tensor> final_norm,
          std::vector<double> eps)
      : n_head_(n_head), n_state_(n_state) {
    TORCH_CHECK(norms.size() == linears.size() && !norms.empty() && final_norm.size() == 2 &&
                    eps.size() == 3 * norms.size() + 1 && n_state % n_head == 0 && (n_state / n_head) % rows::LANES == 0,
                "Decoder: layers, norms and shapes disagree");
    auto norm = [&](const torch::Tensor& w, const torch::Tensor& b, double e) {
      TORCH_CHECK(w.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat && w.numel() == n_state &&
                      b.numel() == n_state, "Decoder: a norm's weight and bias are float32 of n_state");
      return Norm{w.contiguous(), b.contiguous(), static_cast<float>(e)};
    };
    for (size_t i = 0; i < norms.size(); ++i) {
      const auto& n = norms[i];
      const auto& l = linears[i];
      TORCH_CHECK(n.size() == 6 && (l.size() == 6 || l.size() == 8), "Decoder: a layer's norms or linears missing");
      Layer layer;
      layer.attn_ln = norm(n[0], n[1], eps[3 * i]);
      layer.cross_ln = norm(n[2], n[3], eps[3 * i + 1]);
      layer.mlp_ln = norm(n[4], n[5], eps[3 * i + 2]);
      size_t at = 0;
      if (l.size() == 6) {
        layer.qkv.push_back(linear_of(l[at++], 3 * n_state, n_state));
      } else {
        for (int part = 0; part < 3; ++part) layer.qkv.push_back(linear_of(l[at++], n_state, n_state));
      }
      layer.out = linear_of(l[at++], n_state, n_state);
      layer.cross_query = linear_of(l[at++], n_state, n_state);
      layer.cross_out = linear_of(l[at++], n_state, n_state);
      layer.fc1 = linear_of(l[at++], 4 * n_state, n_state);
      layer.fc2 = linear_of(l[at++], n_state, 4 * n_state);
      layers_.push_back(std::move(layer));
    }
    final_ = norm(final_norm[0], final_norm[1], eps.back());
  }

  // x (batch, rows, n_state) float32, the rows' embeddings -> their post-norm states, the same shape.
  // keys, values (n_layer, batch, n_head, slots, d): the self-attention caches, written at ``slots``
  // (batch, rows) and attended over their first ``read`` slots where ``allowed`` (1 or batch, rows,
  // read) holds; cross_keys, cross_values per layer (audios, n_head, n_audio, d), an audio's queries
  // being those of batch / audios consecutive items.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& keys, const torch::Tensor& values,
                        const std::vector<torch::Tensor>& cross_keys, const std::vector<torch::Tensor>& cross_values,
                        const c10::optional<torch::Tensor>& allowed, const torch::Tensor& slots, int64_t read) const {
    const int64_t n_layer = static_cast<int64_t>(layers_.size()), n = n_state_, d = n / n_head_;
    TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() == 3 && x.size(2) == n, "Decoder: x (batch, rows, n_state) float32");
    const int64_t batch = x.size(0), rows = x.size(1), m = batch * rows;
    check_cache(keys, "keys", n_layer, batch, d, read);
    check_cache(values, "values", n_layer, batch, d, read);
    TORCH_CHECK(keys.sizes() == values.sizes() && keys.strides() == values.strides() &&
                    keys.scalar_type() == values.scalar_type(), "Decoder: keys and values disagree");
    TORCH_CHECK(static_cast<int64_t>(cross_keys.size()) == n_layer && static_cast<int64_t>(cross_values.size()) == n_layer,
                "Decoder: one cross-attention's keys and values per layer");
    const auto slot = slots.to(torch::kLong).contiguous();
    TORCH_CHECK(slot.dim() == 2 && slot.size(0) == batch && slot.size(1) == rows, "Decoder: slots (batch, rows)");
    const int64_t* at = slot.data_ptr<int64_t>();
    for (int64_t i = 0; i < m; ++i)
      TORCH_CHECK(at[i] >= 0 && at[i] < read, "Decoder: a row's slot ", at[i], " is past the slots read, ", read);
    const bool* mask = nullptr;
    int64_t mask_batch = 1;
    torch::Tensor mask_c;
    if (allowed && allowed->defined()) {
      mask_c = allowed->contiguous();
      TORCH_CHECK(mask_c.scalar_type() == torch::kBool && mask_c.dim() == 3 && mask_c.size(1) == rows &&
                      mask_c.size(2) == read && (mask_c.size(0) == 1 || mask_c.size(0) == batch),
                  "Decoder: allowed (1 or batch, rows, read) bool");
      mask = mask_c.data_ptr<bool>();
      mask_batch = mask_c.size(0);
    }
    for (int64_t l = 0; l < n_layer; ++l) {
      const auto& ck = cross_keys[l];
      const auto& cv = cross_values[l];
      TORCH_CHECK(ck.dim() == 4 && ck.sizes() == cv.sizes() && ck.scalar_type() == cv.scalar_type() &&
                      (ck.scalar_type() == torch::kFloat || ck.scalar_type() == torch::kBFloat16) &&
                      ck.size(1) == n_head_ && ck.size(3) == d && ck.stride(3) == 1 && ck.stride(2) == d &&
                      cv.stride(3) == 1 && cv.stride(2) == d && ck.size(0) > 0 && batch % ck.size(0) == 0,
                  "Decoder: cross keys and values (audios, n_head, n_audio, d), each key's values contiguous");
    }
    const bool bf16 = keys.scalar_type() == torch::kBFloat16;
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(d));

    auto state = x.contiguous().clone();
    float* s = state.data_ptr<float>();
    std::vector<float> h(m * n), q(m * n), k(m * n), v(m * n), att(m * n), y(m * n), wide(m * 4 * n);
    for (int64_t l = 0; l < n_layer; ++l) {
      const Layer& layer = layers_[l];
      // self-attention: the rows' keys and values into the cache, then every row over its slots
      norm_rows(layer.attn_ln, s, m, n, h.data());
      if (layer.qkv.size() == 1) {
        layer.qkv[0](h.data(), m, wide.data());
        for (int64_t r = 0; r < m; ++r) {
          std::memcpy(q.data() + r * n, wide.data() + r * 3 * n, n * sizeof(float));
          std::memcpy(k.data() + r * n, wide.data() + r * 3 * n + n, n * sizeof(float));
          std::memcpy(v.data() + r * n, wide.data() + r * 3 * n + 2 * n, n * sizeof(float));
        }
      } else {
        layer.qkv[0](h.data(), m, q.data());
        layer.qkv[1](h.data(), m, k.data());
        layer.qkv[2](h.data(), m, v.data());
      }
      write(keys, l, k.data(), batch, rows, at, d);
      write(values, l, v.data(), batch, rows, at, d);
      const int64_t lb = keys.stride(0) * l;
      const auto element = keys.element_size();
      rows::attend_product(q.data(), batch, rows, n_head_, d, static_cast<const char*>(keys.data_ptr()) + lb * element,
                           static_cast<const char*>(values.data_ptr()) + lb * element, bf16, keys.stride(1),
                           keys.stride(2), values.stride(1), values.stride(2), read, mask, mask_batch, q_scale,
                           att.data());
      layer.out(att.data(), m, y.data());
      add(s, y.data(), m * n);
      // cross-attention over the audio's keys and values
      norm_rows(layer.cross_ln, s, m, n, h.data());
      layer.cross_query(h.data(), m, q.data());
      const auto& ck = cross_keys[l];
      const auto& cv = cross_values[l];
      const int64_t audios = ck.size(0);
      rows::attend_product(q.data(), audios, batch / audios * rows, n_head_, d, ck.data_ptr(), cv.data_ptr(),
                           ck.scalar_type() == torch::kBFloat16, ck.stride(0), ck.stride(1), cv.stride(0),
                           cv.stride(1), ck.size(2), nullptr, 1, q_scale, att.data());
      layer.cross_out(att.data(), m, y.data());
      add(s, y.data(), m * n);
      // the MLP
      norm_rows(layer.mlp_ln, s, m, n, h.data());
      layer.fc1(h.data(), m, wide.data());
      gelu(wide.data(), m * 4 * n);
      layer.fc2(wide.data(), m, y.data());
      add(s, y.data(), m * n);
    }
    auto out = torch::empty_like(state);
    norm_rows(final_, s, m, n, out.data_ptr<float>());
    return out;
  }

 private:
  void check_cache(const torch::Tensor& cache, const char* what, int64_t n_layer, int64_t batch, int64_t d,
                   int64_t read) const {
    TORCH_CHECK(cache.dim() == 5 && cache.size(0) == n_layer && cache.size(1) == batch && cache.size(2) == n_head_ &&
                    cache.size(4) == d && cache.size(3) >= read && cache.stride(4) == 1 && cache.stride(3) == d &&
                    (cache.scalar_type() == torch::kFloat || cache.scalar_type() == torch::kBFloat16),
                "Decoder: ", what, " (n_layer, batch, n_head, slots, d) float32 or bfloat16, each slot's values contiguous");
  }

  // rows' keys or values (batch * rows, n_state) into layer l of the cache at their slots, head by head
  void write(const torch::Tensor& cache, int64_t l, const float* src, int64_t batch, int64_t rows,
             const int64_t* slots, int64_t d) const {
    const int64_t n = n_state_;
    const bool bf16 = cache.scalar_type() == torch::kBFloat16;
    c10::BFloat16* const halves = bf16 ? cache.data_ptr<c10::BFloat16>() : nullptr;
    float* const floats = bf16 ? nullptr : cache.data_ptr<float>();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < n_head_; ++h) {
          const int64_t offset = l * cache.stride(0) + b * cache.stride(1) + h * cache.stride(2) + slots[b * rows + r] * d;
          const float* from = src + (b * rows + r) * n + h * d;
          if (bf16) {
            for (int64_t i = 0; i < d; ++i) halves[offset + i] = c10::BFloat16(from[i]);  // nearest even, as .to()
          } else {
            std::memcpy(floats + offset, from, d * sizeof(float));
          }
        }
  }

  int64_t n_head_, n_state_;
  std::vector<Layer> layers_;
  Norm final_;
};

}  // namespace

void rows::bind_decoder(pybind11::module& m) {
  pybind11::class_<Decoder>(m, "Decoder")
      .def(pybind11::init<int64_t, int64_t, std::vector<std::vector<torch::Tensor>>,
                          std::vector<std::vector<std::vector<torch::Tensor>>>, std::vector<torch::Tensor>,
                          std::vector<double>>())
      .def("forward", &Decoder::forward);
}
