// The int8 rows kernel (int8_rows.c) for CPUs with AVX2 but no VNNI: the same exact int32 sums of int8 products, as
// float32, with the same entry point. maddubs multiplies unsigned bytes by signed ones and adds pairs in 16 bits,
// saturating; so each weight's magnitude (|w| <= 128, unsigned) multiplies x carrying w's sign (|x| <= 127), a pair
// stays within 2 * 128 * 127 = 32,512 and is exact, and madd by ones widens the pairs to int32. Full-range weights
// therefore multiply exactly here, where oneDNN's AVX2 int8 products saturate. Built by int8_rows.py with AVX2 and
// OpenMP (torch's own runtime).
#include <immintrin.h>
#include <stdint.h>

// Input rows are taken this many at a time: their sums stay in registers while each weight chunk is loaded, and its
// magnitudes taken, once for all of them.
#define ROW_BLOCK 8

static inline int32_t sum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

// out[r][n] for `rows` (a constant where inlined, so the loops over rows unroll) input rows and one weight row: the
// weight row's 32-byte chunks times each input row's, pairs summed by maddubs and widened to int32 by madd, and the
// last k_len % 32 bytes in plain C.
static inline __attribute__((always_inline)) void dot_rows(const int rows, const int8_t* x, int64_t k_len,
                                                           const int8_t* w, int64_t n_len, float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t full = k_len - k_len % 32;
  __m256i acc[ROW_BLOCK];
  for (int r = 0; r < rows; ++r) acc[r] = _mm256_setzero_si256();
  for (int64_t k = 0; k < full; k += 32) {
    const __m256i wv = _mm256_loadu_si256((const __m256i*)(w + k)), magnitude = _mm256_abs_epi8(wv);
    for (int r = 0; r < rows; ++r) {
      const __m256i xv = _mm256_loadu_si256((const __m256i*)(x + r * k_len + k));
      const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, wv));
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(pairs, ones));
    }
  }
  for (int r = 0; r < rows; ++r) {
    int32_t sum = sum8(acc[r]);
    for (int64_t k = full; k < k_len; ++k) sum += (int32_t)x[r * k_len + k] * (int32_t)w[k];
    out[r * n_len] = (float)sum;
  }
}

static void block(int64_t rows, const int8_t* x, int64_t k_len, const int8_t* w, int64_t n_len, float* out) {
  switch (rows) {
    case 1: dot_rows(1, x, k_len, w, n_len, out); break;
    case 2: dot_rows(2, x, k_len, w, n_len, out); break;
    case 3: dot_rows(3, x, k_len, w, n_len, out); break;
    case 4: dot_rows(4, x, k_len, w, n_len, out); break;
    case 5: dot_rows(5, x, k_len, w, n_len, out); break;
    case 6: dot_rows(6, x, k_len, w, n_len, out); break;
    case 7: dot_rows(7, x, k_len, w, n_len, out); break;
    default: dot_rows(8, x, k_len, w, n_len, out); break;
  }
}

// int8_rows.c's entry point: wsum is not needed here (there is no shift to take back off); scratch holds x as bytes.
void int8_rows(const float* x, int64_t rows, int64_t k_len, const int8_t* w, const int32_t* wsum, int64_t n_len,
               float* out, uint8_t* scratch) {
  (void)wsum;
  int8_t* bytes = (int8_t*)scratch;
  for (int64_t i = 0; i < rows * k_len; ++i) bytes[i] = (int8_t)(int32_t)x[i];
  #pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < n_len; ++n)
    for (int64_t r = 0; r < rows; r += ROW_BLOCK) {
      const int64_t count = rows - r < ROW_BLOCK ? rows - r : ROW_BLOCK;
      block(count, bytes + r * k_len, k_len, w + n * k_len, n_len, out + r * n_len + n);
    }
}
