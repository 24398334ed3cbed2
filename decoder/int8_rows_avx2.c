// The int8 rows kernel (int8_rows.c) for CPUs with AVX2 but no VNNI: the same exact int32 sums of int8 products, as
// float32, with the same entry point. maddubs multiplies unsigned bytes by signed ones and adds pairs in 16 bits,
// saturating; so each weight's magnitude (|w| <= 128, unsigned) multiplies x carrying w's sign (|x| <= 127), a pair
// stays within 2 * 128 * 127 = 32,512 and is exact, and madd by ones widens the pairs to int32. Full-range weights
// therefore multiply exactly here, where oneDNN's AVX2 int8 products saturate. Built by int8_rows.py with AVX2 and
// OpenMP (torch's own runtime).
//
// The weights come in tiles (int8_rows.laid_out): each TILE consecutive weight rows' 32-byte chunks interleaved, so a
// tile streams from memory as one run, [n_pad / TILE][k_pad / 32][TILE][32], zero-padded to whole tiles and chunks.
// Each input chunk loaded serves the tile's TILE products, and each weight chunk up to ROW_BLOCK input rows.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define TILE 4
#define ROW_BLOCK 3

// The four sums of a, b, c and d's lanes, in that order.
static inline __m128i sum4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

// out[r][0..valid) for `rows` input rows (a constant where inlined, so the loops unroll) and one tile of weights;
// x's rows are k_pad bytes apart, zero past k_len, as the tile is.
static inline __attribute__((always_inline)) void tile_rows(const int rows, const int8_t* x, int64_t k_pad,
                                                            const int8_t* tile, int64_t n_len, int valid, float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[ROW_BLOCK][TILE];
  _Pragma("GCC unroll 4") for (int r = 0; r < rows; ++r)
    _Pragma("GCC unroll 4") for (int j = 0; j < TILE; ++j) acc[r][j] = _mm256_setzero_si256();
  for (int64_t k = 0; k < k_pad; k += 32) {
    __m256i wv[TILE], magnitude[TILE];
    _Pragma("GCC unroll 4") for (int j = 0; j < TILE; ++j) {
      wv[j] = _mm256_loadu_si256((const __m256i*)(tile + k * TILE + 32 * j));
      magnitude[j] = _mm256_abs_epi8(wv[j]);
    }
    _Pragma("GCC unroll 4") for (int r = 0; r < rows; ++r) {
      const __m256i xv = _mm256_loadu_si256((const __m256i*)(x + r * k_pad + k));
      _Pragma("GCC unroll 4") for (int j = 0; j < TILE; ++j) {
        const __m256i pairs = _mm256_maddubs_epi16(magnitude[j], _mm256_sign_epi8(xv, wv[j]));
        acc[r][j] = _mm256_add_epi32(acc[r][j], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < rows; ++r) {
    const __m128 sums = _mm_cvtepi32_ps(sum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    if (valid == TILE) {
      _mm_storeu_ps(out + r * n_len, sums);
    } else {  // the last tile, past n_len: only its real rows are written
      float all[TILE];
      _mm_storeu_ps(all, sums);
      memcpy(out + r * n_len, all, valid * sizeof(float));
    }
  }
}

static void block(int64_t rows, const int8_t* x, int64_t k_pad, const int8_t* tile, int64_t n_len, int valid,
                  float* out) {
  switch (rows) {
    case 1: tile_rows(1, x, k_pad, tile, n_len, valid, out); break;
    case 2: tile_rows(2, x, k_pad, tile, n_len, valid, out); break;
    default: tile_rows(3, x, k_pad, tile, n_len, valid, out); break;
  }
}

// The layout int8_rows reads (int8_rows.laid_out): TILE rows a tile, 32 bytes a chunk.
void int8_rows_layout(int64_t* tile, int64_t* chunk) {
  *tile = TILE;
  *chunk = 32;
}

// int8_rows.c's entry point, w tiled as above: wsum is not needed here (there is no shift to take back off); scratch
// holds x as bytes, rows * k_pad of them.
void int8_rows(const float* x, int64_t rows, int64_t k_len, const int8_t* w, const int32_t* wsum, int64_t n_len,
               float* out, uint8_t* scratch) {
  (void)wsum;
  const int64_t k_pad = (k_len + 31) / 32 * 32, tiles = (n_len + TILE - 1) / TILE;
  int8_t* bytes = (int8_t*)scratch;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < k_len; ++k) bytes[r * k_pad + k] = (int8_t)(int32_t)x[r * k_len + k];
    memset(bytes + r * k_pad + k_len, 0, k_pad - k_len);
  }
  #pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n = t * TILE;
    const int valid = n_len - n < TILE ? (int)(n_len - n) : TILE;
    for (int64_t r = 0; r < rows; r += ROW_BLOCK)
      block(rows - r < ROW_BLOCK ? rows - r : ROW_BLOCK, bytes + r * k_pad, k_pad, w + n * k_pad, n_len, valid,
            out + r * n_len + n);
  }
}
