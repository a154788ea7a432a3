// Row-invariant products for a decoder pass's few rows (issue 64): y = x @ W.T (+ b), int8 and float32.
//
// A row's result never depends on the rows computed beside it, the number of threads or the
// instruction set, by construction:
// - int8: each row is quantised alone (its own scale, symmetric, 127 levels) and its integer sums are
//   exact in int32, so only the per-element epilogue rounds, and it is the same sequence of float
//   operations (acc * weight scale * row scale + bias) on every path;
// - float32: each output element is one fused multiply-add chain over k in order, whatever the tile.
// Threads split the output channels, never a sum. Every row of a tile shares one read of the weights,
// so an extra row costs arithmetic, not bytes: what makes verifying drafted tokens cheap.
//
// Weights are packed once (pack_int8, pack_float) into groups of GROUP output channels, padded with
// zeros: int8 as [group][k / 4][GROUP][4] (one 64-byte vector holds 16 channels x 4 k), float32 as
// [group][k][GROUP]. Built with -ffp-contract=off: no multiply and add may be fused behind our back.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int64_t GROUP = 64;   // output channels per packed group: 4 vectors of 16 lanes
constexpr int LEVELS = 127;     // int8 activation levels either side of zero
constexpr int64_t TASK_BYTES = 64 << 10;  // least weight bytes a thread takes: smaller tasks cost more to hand out

enum Isa { SCALAR = 0, AVX2 = 1, AVX512 = 2 };

int detected_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    return AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return AVX2;
  return SCALAR;
}

int& isa_in_use() {
  static int isa = detected_isa();
  return isa;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------ int8

// One row quantised to int8 (k values, then zeros up to k_words * 4); returns its scale. The vector
// paths make the same IEEE operations as the scalar one (a maximum, one division, round to nearest
// even), so a row's levels are the same on every path; they only make it cheap beside the product.
float row_scale_of(float amax) { return std::max(amax, 1e-30f) / static_cast<float>(LEVELS); }

int8_t level(float x, float scale) {
  const float v = std::nearbyint(x / scale);
  return static_cast<int8_t>(std::min(std::max(v, -static_cast<float>(LEVELS)), static_cast<float>(LEVELS)));
}

float quantise_row_scalar(const float* x, int64_t k, int8_t* q) {
  float amax = 0.f;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = row_scale_of(amax);
  for (int64_t i = 0; i < k; ++i) q[i] = level(x[i], scale);
  return scale;
}

__attribute__((target("avx2,fma"))) float quantise_row_avx2(const float* x, int64_t k, int8_t* q) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 vmax = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  float lanes[8];
  _mm256_storeu_ps(lanes, vmax);
  float amax = 0.f;
  for (float v : lanes) amax = std::max(amax, v);
  for (int64_t j = i; j < k; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float scale = row_scale_of(amax);
  const __m256 vs = _mm256_set1_ps(scale), hi = _mm256_set1_ps(LEVELS), lo = _mm256_set1_ps(-LEVELS);
  for (i = 0; i + 8 <= k; i += 8) {
    __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    alignas(32) int32_t ints[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(ints), _mm256_cvtps_epi32(v));
    for (int j = 0; j < 8; ++j) q[i + j] = static_cast<int8_t>(ints[j]);
  }
  for (; i < k; ++i) q[i] = level(x[i], scale);
  return scale;
}

__attribute__((target("avx512f,avx512bw"))) float quantise_row_avx512(const float* x, int64_t k, int8_t* q) {
  __m512 vmax = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  float amax = _mm512_reduce_max_ps(vmax);
  for (int64_t j = i; j < k; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float scale = row_scale_of(amax);
  const __m512 vs = _mm512_set1_ps(scale), hi = _mm512_set1_ps(LEVELS), lo = _mm512_set1_ps(-LEVELS);
  for (i = 0; i + 16 <= k; i += 16) {
    __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  for (; i < k; ++i) q[i] = level(x[i], scale);
  return scale;
}

float quantise_row(const float* x, int64_t k, int64_t k_words, int32_t* words) {
  int8_t* q = reinterpret_cast<int8_t*>(words);
  float scale;
  switch (isa_in_use()) {
    case AVX512: scale = quantise_row_avx512(x, k, q); break;
    case AVX2: scale = quantise_row_avx2(x, k, q); break;
    default: scale = quantise_row_scalar(x, k, q);
  }
  std::memset(q + k, 0, k_words * 4 - k);
  return scale;
}

// The epilogue of one output element: the same float operations on every path.
inline float int8_out(int32_t acc, float weight_scale, float row_scale, const float* bias, int64_t n) {
  float y = static_cast<float>(acc) * weight_scale;
  y = y * row_scale;
  return bias ? y + bias[n] : y;
}

struct Int8Job {
  const int8_t* packed;  // [groups][k_words][GROUP][4]
  const int32_t* colsum; // [groups * GROUP]: sum over k of each channel's weights
  const float* weight_scale;
  const float* bias;     // nullptr: none
  const int32_t* words;  // [rows][k_words]
  const float* row_scale;
  float* y;              // [rows][n]
  int64_t rows, n, k_words;
};

void int8_group_scalar(const Int8Job& job, int64_t g) {
  const int8_t* w = job.packed + g * job.k_words * GROUP * 4;
  for (int64_t r = 0; r < job.rows; ++r) {
    const int8_t* a = reinterpret_cast<const int8_t*>(job.words + r * job.k_words);
    int32_t acc[GROUP] = {0};
    for (int64_t kw = 0; kw < job.k_words; ++kw)
      for (int64_t c = 0; c < GROUP; ++c)
        for (int j = 0; j < 4; ++j) acc[c] += int32_t(a[kw * 4 + j]) * int32_t(w[(kw * GROUP + c) * 4 + j]);
    for (int64_t c = 0; c < GROUP && g * GROUP + c < job.n; ++c) {
      const int64_t ch = g * GROUP + c;
      job.y[r * job.n + ch] = int8_out(acc[c], job.weight_scale[ch], job.row_scale[r], job.bias, ch);
    }
  }
}

// AVX2: |w| (unsigned) times a with w's sign (signed) in pairs never reaches 16 bits' saturation
// (2 * 127 * 127), then pairs summed to int32: exact.
template <int R>
__attribute__((target("avx2,fma"))) void int8_tile_avx2(const Int8Job& job, int64_t g, int64_t r0) {
  const int8_t* w = job.packed + g * job.k_words * GROUP * 4;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int quarter = 0; quarter < 4; ++quarter) {  // 16 channels: two vectors of 8 x 4 bytes
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t kw = 0; kw < job.k_words; ++kw) {
      const int8_t* wk = w + (kw * GROUP + quarter * 16) * 4;
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk + 32));
      const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_set1_epi32(job.words[(r0 + r) * job.k_words + kw]);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, w0)), ones));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, w1)), ones));
      }
    }
    for (int half = 0; half < 2; ++half) {
      const int64_t ch = g * GROUP + quarter * 16 + half * 8;
      const int64_t valid = std::min<int64_t>(8, std::max<int64_t>(0, job.n - ch));
      if (valid == 0) continue;
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256 ws = _mm256_maskload_ps(job.weight_scale + ch, mask);
      const __m256 b = job.bias ? _mm256_maskload_ps(job.bias + ch, mask) : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r) {
        __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][half]), ws);
        y = _mm256_mul_ps(y, _mm256_set1_ps(job.row_scale[r0 + r]));
        if (job.bias) y = _mm256_add_ps(y, b);
        _mm256_maskstore_ps(job.y + (r0 + r) * job.n + ch, mask, y);
      }
    }
  }
}

// AVX-512 VNNI: unsigned times signed bytes, so a row goes in as a + 128 and 128 times each channel's
// weight sum comes off again: exact in int32.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void int8_tile_avx512(const Int8Job& job, int64_t g, int64_t r0) {
  const int8_t* w = job.packed + g * job.k_words * GROUP * 4;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_si512();
  for (int64_t kw = 0; kw < job.k_words; ++kw) {
    const int8_t* wk = w + kw * GROUP * 4;
    const __m512i w0 = _mm512_loadu_si512(wk), w1 = _mm512_loadu_si512(wk + 64);
    const __m512i w2 = _mm512_loadu_si512(wk + 128), w3 = _mm512_loadu_si512(wk + 192);
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_xor_si512(_mm512_set1_epi32(job.words[(r0 + r) * job.k_words + kw]), flip);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], x, w0);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], x, w1);
      acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], x, w2);
      acc[r][3] = _mm512_dpbusd_epi32(acc[r][3], x, w3);
    }
  }
  for (int v = 0; v < 4; ++v) {
    const int64_t ch = g * GROUP + v * 16;
    const int64_t valid = std::min<int64_t>(16, std::max<int64_t>(0, job.n - ch));
    if (valid == 0) continue;
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512i offset = _mm512_slli_epi32(_mm512_loadu_si512(job.colsum + ch), 7);
    const __m512 ws = _mm512_maskz_loadu_ps(mask, job.weight_scale + ch);
    const __m512 b = job.bias ? _mm512_maskz_loadu_ps(mask, job.bias + ch) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][v], offset)), ws);
      y = _mm512_mul_ps(y, _mm512_set1_ps(job.row_scale[r0 + r]));
      if (job.bias) y = _mm512_add_ps(y, b);
      _mm512_mask_storeu_ps(job.y + (r0 + r) * job.n + ch, mask, y);
    }
  }
}

template <void (*T1)(const Int8Job&, int64_t, int64_t), void (*T2)(const Int8Job&, int64_t, int64_t),
          void (*T3)(const Int8Job&, int64_t, int64_t), void (*T4)(const Int8Job&, int64_t, int64_t)>
void tiles_of_four(const Int8Job& job, int64_t g) {
  int64_t r = 0;
  for (; r + 4 <= job.rows; r += 4) T4(job, g, r);
  switch (job.rows - r) {
    case 3: T3(job, g, r); break;
    case 2: T2(job, g, r); break;
    case 1: T1(job, g, r); break;
  }
}

void int8_group(const Int8Job& job, int64_t g) {
  switch (isa_in_use()) {
    case AVX512: {  // 6 rows x 4 vectors of accumulators
      int64_t r = 0;
      for (; r + 6 <= job.rows; r += 6) int8_tile_avx512<6>(job, g, r);
      switch (job.rows - r) {
        case 5: int8_tile_avx512<5>(job, g, r); break;
        case 4: int8_tile_avx512<4>(job, g, r); break;
        case 3: int8_tile_avx512<3>(job, g, r); break;
        case 2: int8_tile_avx512<2>(job, g, r); break;
        case 1: int8_tile_avx512<1>(job, g, r); break;
      }
      return;
    }
    case AVX2:
      return tiles_of_four<int8_tile_avx2<1>, int8_tile_avx2<2>, int8_tile_avx2<3>, int8_tile_avx2<4>>(job, g);
    default:
      return int8_group_scalar(job, g);
  }
}

int64_t grain(int64_t bytes_per_group) { return std::max<int64_t>(1, TASK_BYTES / std::max<int64_t>(1, bytes_per_group)); }

// ------------------------------------------------------------------ float32

struct FloatJob {
  const float* packed;  // [groups][k][GROUP]
  const float* bias;
  const float* x;       // [rows][k]
  float* y;             // [rows][n]
  int64_t rows, n, k;
};

void float_group_scalar(const FloatJob& job, int64_t g) {
  const float* w = job.packed + g * job.k * GROUP;
  for (int64_t r = 0; r < job.rows; ++r) {
    float acc[GROUP] = {0.f};
    for (int64_t i = 0; i < job.k; ++i)
      for (int64_t c = 0; c < GROUP; ++c) acc[c] = std::fma(job.x[r * job.k + i], w[i * GROUP + c], acc[c]);
    for (int64_t c = 0; c < GROUP && g * GROUP + c < job.n; ++c) {
      const int64_t ch = g * GROUP + c;
      job.y[r * job.n + ch] = job.bias ? acc[c] + job.bias[ch] : acc[c];
    }
  }
}

template <int R>
__attribute__((target("avx2,fma"))) void float_tile_avx2(const FloatJob& job, int64_t g, int64_t r0) {
  const float* w = job.packed + g * job.k * GROUP;
  for (int quarter = 0; quarter < 4; ++quarter) {
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < job.k; ++i) {
      const __m256 w0 = _mm256_loadu_ps(w + i * GROUP + quarter * 16), w1 = _mm256_loadu_ps(w + i * GROUP + quarter * 16 + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_broadcast_ss(job.x + (r0 + r) * job.k + i);
        acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
      }
    }
    for (int half = 0; half < 2; ++half) {
      const int64_t ch = g * GROUP + quarter * 16 + half * 8;
      const int64_t valid = std::min<int64_t>(8, std::max<int64_t>(0, job.n - ch));
      if (valid == 0) continue;
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const __m256 b = job.bias ? _mm256_maskload_ps(job.bias + ch, mask) : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r)
        _mm256_maskstore_ps(job.y + (r0 + r) * job.n + ch, mask, job.bias ? _mm256_add_ps(acc[r][half], b) : acc[r][half]);
    }
  }
}

template <int R>
__attribute__((target("avx512f"))) void float_tile_avx512(const FloatJob& job, int64_t g, int64_t r0) {
  const float* w = job.packed + g * job.k * GROUP;
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < job.k; ++i) {
    const float* wk = w + i * GROUP;
    const __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16);
    const __m512 w2 = _mm512_loadu_ps(wk + 32), w3 = _mm512_loadu_ps(wk + 48);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(job.x[(r0 + r) * job.k + i]);
      acc[r][0] = _mm512_fmadd_ps(x, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(x, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(x, w3, acc[r][3]);
    }
  }
  for (int v = 0; v < 4; ++v) {
    const int64_t ch = g * GROUP + v * 16;
    const int64_t valid = std::min<int64_t>(16, std::max<int64_t>(0, job.n - ch));
    if (valid == 0) continue;
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    const __m512 b = job.bias ? _mm512_maskz_loadu_ps(mask, job.bias + ch) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(job.y + (r0 + r) * job.n + ch, mask, job.bias ? _mm512_add_ps(acc[r][v], b) : acc[r][v]);
  }
}

void float_group(const FloatJob& job, int64_t g) {
  switch (isa_in_use()) {
    case AVX512: {
      int64_t r = 0;
      for (; r + 6 <= job.rows; r += 6) float_tile_avx512<6>(job, g, r);
      switch (job.rows - r) {
        case 5: float_tile_avx512<5>(job, g, r); break;
        case 4: float_tile_avx512<4>(job, g, r); break;
        case 3: float_tile_avx512<3>(job, g, r); break;
        case 2: float_tile_avx512<2>(job, g, r); break;
        case 1: float_tile_avx512<1>(job, g, r); break;
      }
      return;
    }
    case AVX2: {
      int64_t r = 0;
      for (; r + 4 <= job.rows; r += 4) float_tile_avx2<4>(job, g, r);
      switch (job.rows - r) {
        case 3: float_tile_avx2<3>(job, g, r); break;
        case 2: float_tile_avx2<2>(job, g, r); break;
        case 1: float_tile_avx2<1>(job, g, r); break;
      }
      return;
    }
    default:
      return float_group_scalar(job, g);
  }
}

void check_rows(const torch::Tensor& x, int64_t k, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.dim() == 2 && x.is_contiguous(),
              what, ": rows must be a contiguous 2-d float32 CPU tensor");
  TORCH_CHECK(x.size(1) == k, what, ": rows have ", x.size(1), " columns, the weight ", k);
}

}  // namespace

// (n, k) int8 weight -> (packed [groups][k_words][GROUP][4] int8, colsum [groups * GROUP] int32)
std::vector<torch::Tensor> pack_int8(const torch::Tensor& qweight) {
  TORCH_CHECK(qweight.scalar_type() == torch::kChar && qweight.dim() == 2, "pack_int8: an (n, k) int8 weight");
  const auto w = qweight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), groups = ceil_div(n, GROUP), k_words = ceil_div(k, 4);
  auto packed = torch::zeros({groups, k_words, GROUP, 4}, torch::kChar);
  auto colsum = torch::zeros({groups * GROUP}, torch::kInt);
  const int8_t* src = w.data_ptr<int8_t>();
  int8_t* dst = packed.data_ptr<int8_t>();
  int32_t* sums = colsum.data_ptr<int32_t>();
  for (int64_t ch = 0; ch < n; ++ch) {
    const int64_t g = ch / GROUP, c = ch % GROUP;
    for (int64_t i = 0; i < k; ++i) {
      dst[((g * k_words + i / 4) * GROUP + c) * 4 + i % 4] = src[ch * k + i];
      sums[ch] += src[ch * k + i];
    }
  }
  return {packed, colsum};
}

// rows (m, k) float32 -> (m, n) float32: each row quantised to int8 with its own scale, times the
// packed int8 weight, times each channel's scale, plus the bias (an undefined tensor: none).
torch::Tensor int8_rows(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& colsum,
                        const torch::Tensor& weight_scale, const c10::optional<torch::Tensor>& bias, int64_t n) {
  const int64_t k_words = packed.size(1), groups = packed.size(0);
  TORCH_CHECK(packed.scalar_type() == torch::kChar && packed.dim() == 4 && packed.size(2) == GROUP && groups * GROUP >= n,
              "int8_rows: weights not packed by pack_int8");
  TORCH_CHECK(x.size(1) <= k_words * 4 && x.size(1) > (k_words - 1) * 4, "int8_rows: rows and weight disagree on k");
  check_rows(x, x.size(1), "int8_rows");
  TORCH_CHECK(weight_scale.scalar_type() == torch::kFloat && weight_scale.numel() == n && weight_scale.is_contiguous());
  const int64_t rows = x.size(0), k = x.size(1);
  auto y = torch::empty({rows, n}, torch::kFloat);
  std::vector<int32_t> words(rows * k_words);
  std::vector<float> scales(rows);
  for (int64_t r = 0; r < rows; ++r) scales[r] = quantise_row(x.data_ptr<float>() + r * k, k, k_words, words.data() + r * k_words);
  const Int8Job job{packed.data_ptr<int8_t>(), colsum.data_ptr<int32_t>(), weight_scale.data_ptr<float>(),
                    bias && bias->defined() ? bias->data_ptr<float>() : nullptr, words.data(), scales.data(),
                    y.data_ptr<float>(), rows, n, k_words};
  at::parallel_for(0, groups, grain(k_words * GROUP * 4), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) int8_group(job, g);
  });
  return y;
}

// (n, k) float32 weight -> packed [groups][k][GROUP] float32
torch::Tensor pack_float(const torch::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == torch::kFloat && weight.dim() == 2, "pack_float: an (n, k) float32 weight");
  const int64_t n = weight.size(0), k = weight.size(1), groups = ceil_div(n, GROUP);
  auto padded = torch::zeros({groups * GROUP, k}, torch::kFloat);
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({groups, GROUP, k}).transpose(1, 2).contiguous();
}

torch::Tensor float_rows(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias,
                         int64_t n) {
  TORCH_CHECK(packed.scalar_type() == torch::kFloat && packed.dim() == 3 && packed.size(2) == GROUP &&
              packed.size(0) * GROUP >= n, "float_rows: weights not packed by pack_float");
  check_rows(x, packed.size(1), "float_rows");
  const int64_t rows = x.size(0), k = x.size(1), groups = packed.size(0);
  auto y = torch::empty({rows, n}, torch::kFloat);
  const FloatJob job{packed.data_ptr<float>(), bias && bias->defined() ? bias->data_ptr<float>() : nullptr,
                     x.data_ptr<float>(), y.data_ptr<float>(), rows, n, k};
  at::parallel_for(0, groups, grain(k * GROUP * 4), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) float_group(job, g);
  });
  return y;
}

// The instruction sets this CPU runs, best last, and the one in use; set_isa picks another (tests).
std::vector<std::string> isas() {
  static const char* names[] = {"scalar", "avx2", "avx512"};
  std::vector<std::string> out;
  for (int i = 0; i <= detected_isa(); ++i) out.push_back(names[i]);
  return out;
}

std::string isa() { return isas()[isa_in_use()]; }

void set_isa(const std::string& name) {
  const auto found = isas();
  const auto at = std::find(found.begin(), found.end(), name);
  TORCH_CHECK(at != found.end(), "set_isa: this CPU does not run ", name);
  isa_in_use() = static_cast<int>(at - found.begin());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_int8", &pack_int8);
  m.def("int8_rows", &int8_rows);
  m.def("pack_float", &pack_float);
  m.def("float_rows", &float_rows);
  m.def("isas", &isas);
  m.def("isa", &isa);
  m.def("set_isa", &set_isa);
}
