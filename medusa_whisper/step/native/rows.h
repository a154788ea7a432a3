// What rows.cpp's kernels offer the other sources of the package's native module (decoder.cpp): the
// products and the attention on raw buffers, and the lane-by-lane float helpers whose operations are
// the same on every instruction set. The guarantees are rows.cpp's (its header).
#pragma once

#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace rows {

constexpr int LANES = 16;
constexpr int64_t GROUP = 64;  // output channels per packed group: 4 vectors of 16 lanes

// y (m, n) = x (m, k) @ W.T * scale + bias for pack_int8's weights, each row quantised alone.
void int8_product(const float* x, int64_t m, int64_t k, const int8_t* packed, const int32_t* colsum, int64_t groups,
                  int64_t k_words, const float* weight_scale, const float* bias, int64_t n, float* y);

// y (m, n) = x (m, k) @ W.T + bias for pack_float's weights, one fused multiply-add chain per output.
void float_product(const float* x, int64_t m, int64_t k, const float* packed, int64_t groups, const float* bias,
                   int64_t n, float* y);

// softmax(q k^T * q_scale) v, q and out (batch, rows, n_head * d); key (b, h, j) at k + b * kb + h * kh + j * d.
void attend_product(const float* q, int64_t batch, int64_t rows, int64_t n_head, int64_t d, const void* k,
                    const void* v, bool bf16, int64_t kb, int64_t kh, int64_t vb, int64_t vh, int64_t n_key,
                    const bool* mask, int64_t mask_batch, float q_scale, float* out);

// The instruction set the kernels run: 0 plain C++, 1 AVX2, 2 AVX-512 (set_isa changes it).
int isa_in_use();

// The decoder's layers in one call (decoder.cpp), added to the module.
void bind_decoder(pybind11::module& m);

inline float tree_sum(float* lanes) {  // lanes[0..16) summed pairwise, lanes overwritten
  for (int width = LANES / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] = lanes[l] + lanes[l + width];
  return lanes[0];
}

// e^x in float32 by Cephes' polynomial, lane by lane, the same bits on every path; 0 below -87.
inline float exp_lane(float x) {
  const bool zero = x < -87.0f;
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float up = x * 1.44269504088896341f + 0.5f;  // floor(up) by truncation (|up| < 128): vectorises
  const float cut = static_cast<float>(static_cast<int32_t>(up));
  const float n = cut > up ? cut - 1.0f : cut;
  x = x - n * 0.693359375f;
  x = x - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * (x * x) + x + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return zero ? 0.0f : y * scale;
}

// exp_lane on 16 lanes in AVX-512 registers, its operations in its order; lanes in ``zero`` give 0.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x, __mmask16 zero) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 up = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _mm512_set1_ps(0.5f));
  const __m512 cut = _mm512_cvtepi32_ps(_mm512_cvttps_epi32(up));
  const __m512 n = _mm512_mask_sub_ps(cut, _mm512_cmp_ps_mask(cut, up, _CMP_GT_OQ), cut, _mm512_set1_ps(1.0f));
  x = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  x = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_add_ps(_mm512_mul_ps(y, x), _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_add_ps(_mm512_mul_ps(y, x), _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_add_ps(_mm512_mul_ps(y, x), _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_add_ps(_mm512_mul_ps(y, x), _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_add_ps(_mm512_mul_ps(y, x), _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(y, _mm512_mul_ps(x, x)), x), _mm512_set1_ps(1.0f));
  const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~zero), y, scale);
}

// exp_lane on 8 lanes in AVX2 registers, its operations in its order; lanes set in ``zero`` give 0.
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x, __m256 zero) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 up = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f));
  const __m256 cut = _mm256_cvtepi32_ps(_mm256_cvttps_epi32(up));
  const __m256 n = _mm256_blendv_ps(cut, _mm256_sub_ps(cut, _mm256_set1_ps(1.0f)), _mm256_cmp_ps(cut, up, _CMP_GT_OQ));
  x = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(x, x)), x), _mm256_set1_ps(1.0f));
  const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(zero, _mm256_mul_ps(y, scale));
}

}  // namespace rows
