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
#include "rows.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using rows::GROUP;
constexpr int LEVELS = 127;     // int8 activation levels either side of zero
// Weights are streamed once per tile of rows, and with several rows the loads of one k step wait
// behind its products: asking for the lines this far ahead keeps the memory busy meanwhile
// (base's vocabulary, 6 float32 rows: 7.9 ms without, 5.9 ms with, against 5.2 ms for one row).
constexpr int64_t PREFETCH_BYTES = 4096;
constexpr int64_t TASK_BYTES = 64 << 10;  // least weight bytes a thread takes: smaller tasks cost more to hand out

// the 256 bytes of weights one k step of a group reads, PREFETCH_BYTES after ``step``
inline void ahead(const void* step) {
  const char* at = static_cast<const char*>(step) + PREFETCH_BYTES;
  for (int line = 0; line < 4; ++line) _mm_prefetch(at + line * 64, _MM_HINT_T0);
}

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
      if (quarter == 0) ahead(w + kw * GROUP * 4);
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
    ahead(wk);
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

// Rows in tiles of MAX (as many as a tile's accumulators fit in registers), then one tile of the
// rest; ``Tile::run<R>`` computes R rows from row r of group g.
template <int R, typename Job, typename Tile>
void last_tile(const Job& job, int64_t g, int64_t r, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) return Tile::template run<R>(job, g, r);
    last_tile<R - 1, Job, Tile>(job, g, r, left);
  }
}

template <int MAX, typename Job, typename Tile>
void in_tiles(const Job& job, int64_t g) {
  int64_t r = 0;
  for (; r + MAX <= job.rows; r += MAX) Tile::template run<MAX>(job, g, r);
  last_tile<MAX - 1, Job, Tile>(job, g, r, job.rows - r);
}

struct Int8Avx512 { template <int R> static void run(const Int8Job& j, int64_t g, int64_t r) { int8_tile_avx512<R>(j, g, r); } };
struct Int8Avx2 { template <int R> static void run(const Int8Job& j, int64_t g, int64_t r) { int8_tile_avx2<R>(j, g, r); } };

void int8_group(const Int8Job& job, int64_t g) {
  switch (isa_in_use()) {
    case AVX512: return in_tiles<6, Int8Job, Int8Avx512>(job, g);  // 6 rows x 4 vectors of accumulators
    case AVX2: return in_tiles<4, Int8Job, Int8Avx2>(job, g);
    default: return int8_group_scalar(job, g);
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
      if (quarter == 0) ahead(w + i * GROUP);
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
    ahead(wk);
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

struct FloatAvx512 { template <int R> static void run(const FloatJob& j, int64_t g, int64_t r) { float_tile_avx512<R>(j, g, r); } };
struct FloatAvx2 { template <int R> static void run(const FloatJob& j, int64_t g, int64_t r) { float_tile_avx2<R>(j, g, r); } };

void float_group(const FloatJob& job, int64_t g) {
  switch (isa_in_use()) {
    case AVX512: return in_tiles<6, FloatJob, FloatAvx512>(job, g);
    case AVX2: return in_tiles<4, FloatJob, FloatAvx2>(job, g);
    default: return float_group_scalar(job, g);
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

void rows::int8_product(const float* x, int64_t m, int64_t k, const int8_t* packed, const int32_t* colsum,
                        int64_t groups, int64_t k_words, const float* weight_scale, const float* bias, int64_t n,
                        float* y) {
  std::vector<int32_t> words(m * k_words);
  std::vector<float> scales(m);
  for (int64_t r = 0; r < m; ++r) scales[r] = quantise_row(x + r * k, k, k_words, words.data() + r * k_words);
  const Int8Job job{packed, colsum, weight_scale, bias, words.data(), scales.data(), y, m, n, k_words};
  at::parallel_for(0, groups, grain(k_words * GROUP * 4), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) int8_group(job, g);
  });
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
  rows::int8_product(x.data_ptr<float>(), rows, k, packed.data_ptr<int8_t>(), colsum.data_ptr<int32_t>(), groups, k_words,
                     weight_scale.data_ptr<float>(), bias && bias->defined() ? bias->data_ptr<float>() : nullptr, n,
                     y.data_ptr<float>());
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

void rows::float_product(const float* x, int64_t m, int64_t k, const float* packed, int64_t groups,
                         const float* bias, int64_t n, float* y) {
  const FloatJob job{packed, bias, x, y, m, n, k};
  at::parallel_for(0, groups, grain(k * GROUP * 4), [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) float_group(job, g);
  });
}

torch::Tensor float_rows(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias,
                         int64_t n) {
  TORCH_CHECK(packed.scalar_type() == torch::kFloat && packed.dim() == 3 && packed.size(2) == GROUP &&
              packed.size(0) * GROUP >= n, "float_rows: weights not packed by pack_float");
  check_rows(x, packed.size(1), "float_rows");
  const int64_t rows = x.size(0), k = x.size(1);
  auto y = torch::empty({rows, n}, torch::kFloat);
  rows::float_product(x.data_ptr<float>(), rows, k, packed.data_ptr<float>(), packed.size(0),
                      bias && bias->defined() ? bias->data_ptr<float>() : nullptr, n, y.data_ptr<float>());
  return y;
}

// ------------------------------------------------------------------ attention
//
// softmax(q k^T) v for a pass's query rows over keys and values kept in bfloat16 or float32, float32
// throughout. A row's result depends on nothing but its own query, mask and the keys it sees:
// - every sum has one order: a dot product over d_head in 16 lanes then a fixed tree; the softmax's
//   sum and the weighted sum of values key after key, in slot order;
// - a masked key adds an exact zero, so attending over more (masked) slots, or seeing a key at
//   another slot with masked ones between (a tree's branches), changes no bit;
// - the code is written lane by lane in plain C++ (products and sums as fused multiply-adds where
//   they are in the vector code) and repeated in AVX-512 registers for the two products of 64-wide
//   heads: every path makes the same operations in the same order.
namespace {

using rows::LANES;
using rows::exp_lane;
using rows::tree_sum;

// One row's scores over its keys (masked: -inf; padded to ``padded`` slots, a multiple of 16) made
// its softmax's numerators in place. Compiled for each instruction set: the same operations lane by
// lane on every one.
__attribute__((target_clones("avx512f", "avx2", "default")))
void softmax_row(float* s, int64_t n_key, int64_t padded) {
  for (int64_t j = n_key; j < padded; ++j) s[j] = -INFINITY;
  float top[LANES];
  for (int l = 0; l < LANES; ++l) top[l] = -INFINITY;
  for (int64_t j = 0; j < padded; j += LANES)
    for (int l = 0; l < LANES; ++l) top[l] = std::max(top[l], s[j + l]);
  float most = top[0];
  for (int l = 1; l < LANES; ++l) most = std::max(most, top[l]);
  for (int64_t j = 0; j < padded; j += LANES)
    for (int l = 0; l < LANES; ++l) s[j + l] = s[j + l] == -INFINITY ? 0.f : exp_lane(s[j + l] - most);
}

// softmax_row in AVX-512 registers: exp_lane's operations, in its order, 16 keys at a time.
__attribute__((target("avx512f"))) void softmax_row_avx512(float* s, int64_t n_key, int64_t padded) {
  for (int64_t j = n_key; j < padded; ++j) s[j] = -INFINITY;
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  __m512 top = minus_inf;
  for (int64_t j = 0; j < padded; j += LANES) top = _mm512_max_ps(top, _mm512_loadu_ps(s + j));
  const __m512 most = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  for (int64_t j = 0; j < padded; j += LANES) {
    const __m512 score = _mm512_loadu_ps(s + j);
    __m512 x = _mm512_sub_ps(score, most);
    const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ) |
                           _mm512_cmp_ps_mask(score, minus_inf, _CMP_EQ_OQ);
    _mm512_storeu_ps(s + j, rows::exp16(x, zero));
  }
}

template <typename T> inline float widen(T v);
template <> inline float widen<float>(float v) { return v; }
template <> inline float widen<c10::BFloat16>(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct AttendJob {
  const float* q;        // [batch][rows][n_head * d]
  const void* k;         // element (b, h, j, i) at b * kb + h * kh + j * d + i
  const void* v;
  const bool* allowed;   // [1 or batch][rows][n_key], or nullptr
  float* out;            // [batch][rows][n_head * d]
  int64_t batch, rows, n_head, d, n_key, kb, kh, vb, vh, mask_batch;
  float q_scale;
};

// 16 widened values of a key or value row, on AVX-512: bfloat16's bits moved up, or float32 as it is
template <typename T> __m512 widen16(const T* p);
template <> __attribute__((target("avx512f"))) inline __m512 widen16<float>(const float* p) { return _mm512_loadu_ps(p); }
template <> __attribute__((target("avx512f"))) inline __m512 widen16<c10::BFloat16>(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// tree_sum of one vector's 16 lanes, in tree_sum's order
__attribute__((target("avx512f"))) inline float tree_sum16(__m512 x) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 e = _mm_add_ss(c, _mm_shuffle_ps(c, c, 1));
  return _mm_cvtss_f32(e);
}

// The two products of one head for whisper's 64-wide heads, the same operations as the plain code
// below in vector registers: a key or value widened once for every row of the pass.
constexpr int64_t WIDE_D = 64;

// Sixteen keys' lane vectors summed each in tree_sum's order (l + l+8, then + l+4, + l+2, + l+1) by
// transposing as it adds; returns the sums in key order.
__attribute__((target("avx512f"))) inline __m512 tree_sums16(const __m512* lanes) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)  // [key 2i lanes 0-7 + 8-15, key 2i+1 lanes 0-7 + 8-15]
    pairs[i] = _mm512_add_ps(_mm512_shuffle_f32x4(lanes[2 * i], lanes[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(lanes[2 * i], lanes[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // block k: key 4i + k, lanes 0-3 + 4-7
    quads[i] = _mm512_add_ps(_mm512_shuffle_f32x4(pairs[2 * i], pairs[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(pairs[2 * i], pairs[2 * i + 1], 0xDD));
  // block k: [key k, key 4 + k] then [key 8 + k, key 12 + k], lanes 0 + 2 and 1 + 3
  const __m512 low = _mm512_add_ps(_mm512_shuffle_ps(quads[0], quads[1], 0x44), _mm512_shuffle_ps(quads[0], quads[1], 0xEE));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_ps(quads[2], quads[3], 0x44), _mm512_shuffle_ps(quads[2], quads[3], 0xEE));
  // block k: keys k, 4 + k, 8 + k, 12 + k, lanes 0 + 1
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(low, high, 0x88), _mm512_shuffle_ps(low, high, 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}

template <typename T>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void scores_avx512(const AttendJob& job, int64_t b, int64_t h, const T* k, int64_t padded,
                                                      const bool* mask, float* scores) {
  const int64_t width = job.n_head * WIDE_D;
  alignas(64) float block[LANES * WIDE_D];  // sixteen keys widened once for every row
  int64_t j = 0;
  for (; j + LANES <= job.n_key; j += LANES) {
    for (int key = 0; key < LANES; ++key)
      for (int c = 0; c < 4; ++c)
        _mm512_store_ps(block + key * WIDE_D + c * 16, widen16<T>(k + (j + key) * WIDE_D + c * 16));
    for (int64_t r = 0; r < job.rows; ++r) {
      const float* q = job.q + (b * job.rows + r) * width + h * WIDE_D;
      const __m512 q0 = _mm512_loadu_ps(q), q1 = _mm512_loadu_ps(q + 16), q2 = _mm512_loadu_ps(q + 32), q3 = _mm512_loadu_ps(q + 48);
      __m512 lanes[LANES];
      for (int key = 0; key < LANES; ++key) {
        const float* kf = block + key * WIDE_D;
        __m512 acc = _mm512_mul_ps(q0, _mm512_load_ps(kf));
        acc = _mm512_fmadd_ps(q1, _mm512_load_ps(kf + 16), acc);
        acc = _mm512_fmadd_ps(q2, _mm512_load_ps(kf + 32), acc);
        lanes[key] = _mm512_fmadd_ps(q3, _mm512_load_ps(kf + 48), acc);
      }
      __m512 out = _mm512_mul_ps(tree_sums16(lanes), _mm512_set1_ps(job.q_scale));
      if (mask) {
        const __m128i allowed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mask + r * job.n_key + j));
        const __mmask16 blocked = _mm_cmpeq_epi8_mask(allowed, _mm_setzero_si128());
        out = _mm512_mask_mov_ps(out, blocked, _mm512_set1_ps(-INFINITY));
      }
      _mm512_storeu_ps(scores + r * padded + j, out);
    }
  }
  for (; j < job.n_key; ++j) {  // the last keys one by one, each summed in the same order
    const T* key = k + j * WIDE_D;
    const __m512 k0 = widen16<T>(key), k1 = widen16<T>(key + 16), k2 = widen16<T>(key + 32), k3 = widen16<T>(key + 48);
    for (int64_t r = 0; r < job.rows; ++r) {
      const float* q = job.q + (b * job.rows + r) * width + h * WIDE_D;
      __m512 lanes = _mm512_mul_ps(_mm512_loadu_ps(q), k0);
      lanes = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16), k1, lanes);
      lanes = _mm512_fmadd_ps(_mm512_loadu_ps(q + 32), k2, lanes);
      lanes = _mm512_fmadd_ps(_mm512_loadu_ps(q + 48), k3, lanes);
      const float score = tree_sum16(lanes) * job.q_scale;
      scores[r * padded + j] = (mask && !mask[r * job.n_key + j]) ? -INFINITY : score;
    }
  }
}

template <typename T, int R>
__attribute__((target("avx512f"))) void weighted_tile_avx512(const AttendJob& job, const T* v, int64_t padded,
                                                             float* scores, float* acc, int64_t r0) {
  __m512 sum[R][4];
  float total[R];
  for (int r = 0; r < R; ++r) {
    total[r] = 0.f;
    for (int c = 0; c < 4; ++c) sum[r][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < job.n_key; ++j) {
    const T* value = v + j * WIDE_D;
    const __m512 v0 = widen16<T>(value), v1 = widen16<T>(value + 16), v2 = widen16<T>(value + 32), v3 = widen16<T>(value + 48);
    for (int r = 0; r < R; ++r) {
      const float weight = scores[(r0 + r) * padded + j];
      total[r] = total[r] + weight;
      const __m512 p = _mm512_set1_ps(weight);
      sum[r][0] = _mm512_fmadd_ps(p, v0, sum[r][0]);
      sum[r][1] = _mm512_fmadd_ps(p, v1, sum[r][1]);
      sum[r][2] = _mm512_fmadd_ps(p, v2, sum[r][2]);
      sum[r][3] = _mm512_fmadd_ps(p, v3, sum[r][3]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc + (r0 + r) * WIDE_D + c * 16, sum[r][c]);
    scores[(r0 + r) * padded + job.n_key] = total[r];
  }
}

template <typename T>
void weighted_avx512(const AttendJob& job, const T* v, int64_t padded, float* scores, float* acc) {
  int64_t r = 0;
  for (; r + 4 <= job.rows; r += 4) weighted_tile_avx512<T, 4>(job, v, padded, scores, acc, r);
  switch (job.rows - r) {
    case 3: weighted_tile_avx512<T, 3>(job, v, padded, scores, acc, r); break;
    case 2: weighted_tile_avx512<T, 2>(job, v, padded, scores, acc, r); break;
    case 1: weighted_tile_avx512<T, 1>(job, v, padded, scores, acc, r); break;
  }
}

template <typename T>
void attend_head(const AttendJob& job, int64_t b, int64_t h, float* scores, float* kv, float* acc) {
  const int64_t d = job.d, n_key = job.n_key, rows = job.rows, padded = ceil_div(n_key + 1, LANES) * LANES;
  const int64_t width = job.n_head * d;
  const T* k = static_cast<const T*>(job.k) + b * job.kb + h * job.kh;
  const T* v = static_cast<const T*>(job.v) + b * job.vb + h * job.vh;
  const bool* mask = job.allowed ? job.allowed + (job.mask_batch > 1 ? b : 0) * rows * n_key : nullptr;
  const bool wide = isa_in_use() == AVX512 && d == WIDE_D;
  if (wide) {
    scores_avx512<T>(job, b, h, k, padded, mask, scores);
  } else {
    for (int64_t j = 0; j < n_key; ++j) {  // each key widened once, then dotted with every row
      for (int64_t i = 0; i < d; ++i) kv[i] = widen<T>(k[j * d + i]);
      for (int64_t r = 0; r < rows; ++r) {
        const float* q = job.q + (b * rows + r) * width + h * d;
        float lanes[LANES];
        for (int l = 0; l < LANES; ++l) lanes[l] = q[l] * kv[l];
        for (int64_t c = LANES; c < d; c += LANES)
          for (int l = 0; l < LANES; ++l) lanes[l] = std::fma(q[c + l], kv[c + l], lanes[l]);
        const float score = tree_sum(lanes) * job.q_scale;
        scores[r * padded + j] = (mask && !mask[r * n_key + j]) ? -INFINITY : score;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (isa_in_use() == AVX512)
      softmax_row_avx512(scores + r * padded, n_key, padded);
    else
      softmax_row(scores + r * padded, n_key, padded);
  }
  // the weighted sum of values, key after key
  for (int64_t i = 0; i < rows * d; ++i) acc[i] = 0.f;
  if (wide) {
    weighted_avx512<T>(job, v, padded, scores, acc);
  } else {
    for (int64_t r = 0; r < rows; ++r) scores[r * padded + n_key] = 0.f;
    for (int64_t j = 0; j < n_key; ++j) {
      for (int64_t i = 0; i < d; ++i) kv[i] = widen<T>(v[j * d + i]);
      for (int64_t r = 0; r < rows; ++r) {
        const float p = scores[r * padded + j];
        scores[r * padded + n_key] = scores[r * padded + n_key] + p;
        float* a = acc + r * d;
        for (int64_t i = 0; i < d; ++i) a[i] = std::fma(p, kv[i], a[i]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float total = scores[r * padded + n_key];
    float* o = job.out + (b * rows + r) * width + h * d;
    for (int64_t i = 0; i < d; ++i) o[i] = acc[r * d + i] / total;
  }
}

}  // namespace

// q (batch, rows, n_head * d) float32; k, v (batch, n_head, n_key, d) bfloat16 or float32, each key's d
// values contiguous; allowed (1 or batch, rows, n_key) bool or None -> (batch, rows, n_head * d) float32.
// q is scaled by q_scale after its dot products (1 / sqrt(d): a power of two for whisper's 64).
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const c10::optional<torch::Tensor>& allowed, int64_t n_head, double q_scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat && q.dim() == 3 && q.is_contiguous(), "attend: q (batch, rows, width) float32");
  TORCH_CHECK(k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type() &&
              (k.scalar_type() == torch::kFloat || k.scalar_type() == torch::kBFloat16), "attend: k, v (batch, heads, keys, d)");
  const int64_t batch = q.size(0), rows = q.size(1), d = k.size(3), n_key = k.size(2);
  TORCH_CHECK(k.size(0) == batch && k.size(1) == n_head && n_head * d == q.size(2) && d % LANES == 0, "attend: shapes disagree");
  TORCH_CHECK(k.stride(3) == 1 && k.stride(2) == d && v.stride(3) == 1 && v.stride(2) == d, "attend: each key's values contiguous");
  const bool* mask = nullptr;
  int64_t mask_batch = 1;
  torch::Tensor mask_c;
  if (allowed && allowed->defined()) {
    mask_c = allowed->contiguous();
    TORCH_CHECK(mask_c.scalar_type() == torch::kBool && mask_c.dim() == 3 && mask_c.size(1) == rows && mask_c.size(2) == n_key &&
                (mask_c.size(0) == 1 || mask_c.size(0) == batch), "attend: allowed (1 or batch, rows, keys) bool");
    mask = mask_c.data_ptr<bool>();
    mask_batch = mask_c.size(0);
  }
  auto out = torch::empty({batch, rows, n_head * d}, torch::kFloat);
  rows::attend_product(q.data_ptr<float>(), batch, rows, n_head, d, k.data_ptr(), v.data_ptr(),
                       k.scalar_type() == torch::kBFloat16, k.stride(0), k.stride(1), v.stride(0), v.stride(1), n_key,
                       mask, mask_batch, static_cast<float>(q_scale), out.data_ptr<float>());
  return out;
}

void rows::attend_product(const float* q, int64_t batch, int64_t rows, int64_t n_head, int64_t d, const void* k,
                          const void* v, bool bf16, int64_t kb, int64_t kh, int64_t vb, int64_t vh, int64_t n_key,
                          const bool* mask, int64_t mask_batch, float q_scale, float* out) {
  const AttendJob job{q, k, v, mask, out, batch, rows, n_head, d, n_key, kb, kh, vb, vh, mask_batch, q_scale};
  const int64_t padded = ceil_div(n_key + 1, LANES) * LANES;
  at::parallel_for(0, batch * n_head, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(rows * padded), kv(d), acc(rows * d);
    for (int64_t task = begin; task < end; ++task) {
      if (bf16)
        attend_head<c10::BFloat16>(job, task / n_head, task % n_head, scores.data(), kv.data(), acc.data());
      else
        attend_head<float>(job, task / n_head, task % n_head, scores.data(), kv.data(), acc.data());
    }
  });
}

// The instruction sets this CPU runs, best last, and the one in use; set_isa picks another (tests).
std::vector<std::string> isas() {
  static const char* names[] = {"scalar", "avx2", "avx512"};
  std::vector<std::string> out;
  for (int i = 0; i <= detected_isa(); ++i) out.push_back(names[i]);
  return out;
}

std::string isa() { return isas()[isa_in_use()]; }

int rows::isa_in_use() { return ::isa_in_use(); }

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
  m.def("attend", &attend);
  m.def("isas", &isas);
  m.def("isa", &isa);
  m.def("set_isa", &set_isa);
  rows::bind_decoder(m);
}
