// Exact int32 sums of int8 products for the few rows decoding feeds, as float32: out[r][n] = sum_k x[r][k] * w[n][k].
//
// x holds integral floats in [-127, 127] (Int8Linear's quantized activations); w is int8, [n_len][k_len], as
// quantized. VNNI's dpbusd multiplies unsigned by signed bytes, so x is shifted by 128 and 128 * sum_k w[n][k]
// (wsum) is taken back off: the same integers, summed exactly in int32 in any order, then rounded to float32 once,
// so the result equals oneDNN's, and torch._int_mm's converted to float32, bit for bit. Built by int8_rows.py with AVX-512 VNNI and OpenMP (torch's own
// runtime, so the threads are the ones torch.set_num_threads gives).
#include <immintrin.h>
#include <stdint.h>

// Up to this many rows, each weight row is streamed once and dotted with each input row in turn; the input rows
// stay in L1. From there on, four weight rows at a time, so that each input chunk loaded serves four products.
#define ROW_AT_A_TIME_MAX 8

static inline __mmask64 tail_mask(int64_t k_len) {
  return (k_len % 64) ? (~0ULL) >> (64 - k_len % 64) : 0;
}

static inline int32_t dot(const uint8_t* x, const int8_t* w, int64_t full, __mmask64 tail) {
  __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 128 <= full; k += 128) {
    acc0 = _mm512_dpbusd_epi32(acc0, _mm512_loadu_si512(x + k), _mm512_loadu_si512(w + k));
    acc1 = _mm512_dpbusd_epi32(acc1, _mm512_loadu_si512(x + k + 64), _mm512_loadu_si512(w + k + 64));
  }
  if (k < full) acc0 = _mm512_dpbusd_epi32(acc0, _mm512_loadu_si512(x + k), _mm512_loadu_si512(w + k));
  if (tail)
    acc1 = _mm512_dpbusd_epi32(acc1, _mm512_maskz_loadu_epi8(tail, x + full), _mm512_maskz_loadu_epi8(tail, w + full));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1));
}

// The four sums of a, b, c and d's lanes, in that order.
static inline __m128i sum4(__m512i a, __m512i b, __m512i c, __m512i d) {
  __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  __m512i abcd = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

static void four_at_a_time(const uint8_t* x, int64_t rows, int64_t k_len, const int8_t* w, const int32_t* wsum,
                           int64_t n_len, float* out) {
  const int64_t groups = n_len / 4, full = k_len - k_len % 64;
  const __mmask64 tail = tail_mask(k_len);
  #pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t n = 4 * g;
    const int8_t *w0 = w + n * k_len, *w1 = w0 + k_len, *w2 = w1 + k_len, *w3 = w2 + k_len;
    const __m128i shift = _mm_slli_epi32(_mm_loadu_si128((const __m128i*)(wsum + n)), 7);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* xr = x + r * k_len;
      __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t k = 0; k < full; k += 64) {
        const __m512i xv = _mm512_loadu_si512(xr + k);
        a0 = _mm512_dpbusd_epi32(a0, xv, _mm512_loadu_si512(w0 + k));
        a1 = _mm512_dpbusd_epi32(a1, xv, _mm512_loadu_si512(w1 + k));
        a2 = _mm512_dpbusd_epi32(a2, xv, _mm512_loadu_si512(w2 + k));
        a3 = _mm512_dpbusd_epi32(a3, xv, _mm512_loadu_si512(w3 + k));
      }
      if (tail) {
        const __m512i xv = _mm512_maskz_loadu_epi8(tail, xr + full);
        a0 = _mm512_dpbusd_epi32(a0, xv, _mm512_maskz_loadu_epi8(tail, w0 + full));
        a1 = _mm512_dpbusd_epi32(a1, xv, _mm512_maskz_loadu_epi8(tail, w1 + full));
        a2 = _mm512_dpbusd_epi32(a2, xv, _mm512_maskz_loadu_epi8(tail, w2 + full));
        a3 = _mm512_dpbusd_epi32(a3, xv, _mm512_maskz_loadu_epi8(tail, w3 + full));
      }
      _mm_storeu_ps(out + r * n_len + n, _mm_cvtepi32_ps(_mm_sub_epi32(sum4(a0, a1, a2, a3), shift)));
    }
  }
  for (int64_t n = 4 * groups; n < n_len; ++n)
    for (int64_t r = 0; r < rows; ++r)
      out[r * n_len + n] = (float)(dot(x + r * k_len, w + n * k_len, full, tail) - 128 * wsum[n]);
}

static void row_at_a_time(const uint8_t* x, int64_t rows, int64_t k_len, const int8_t* w, const int32_t* wsum,
                          int64_t n_len, float* out) {
  const int64_t full = k_len - k_len % 64;
  const __mmask64 tail = tail_mask(k_len);
  #pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < n_len; ++n)
    for (int64_t r = 0; r < rows; ++r)
      out[r * n_len + n] = (float)(dot(x + r * k_len, w + n * k_len, full, tail) - 128 * wsum[n]);
}

// The layout int8_rows reads (int8_rows.laid_out): weight rows as they lie.
void int8_rows_layout(int64_t* tile, int64_t* chunk) {
  *tile = 1;
  *chunk = 1;
}

// shifted: rows * k_len bytes of scratch for x + 128.
void int8_rows(const float* x, int64_t rows, int64_t k_len, const int8_t* w, const int32_t* wsum, int64_t n_len,
               float* out, uint8_t* shifted) {
  for (int64_t i = 0; i < rows * k_len; ++i) shifted[i] = (uint8_t)((int32_t)x[i] + 128);
  if (rows <= ROW_AT_A_TIME_MAX)
    row_at_a_time(shifted, rows, k_len, w, wsum, n_len, out);
  else
    four_at_a_time(shifted, rows, k_len, w, wsum, n_len, out);
}
