/* Attention for the few rows a decode step or a verify feeds (attend_rows.py), float32.
 *
 * Each row attends over the cache's first `start` positions and then its own path: the rows before it on its
 * path and itself, whose keys and values sit at start + the row's index. Of that sequence only the last
 * `window` keys count where a window is set. A row of a head is one work item, computed alone and in one order
 * whatever the other rows are, so a verify row's result is the one-row step's at its position, bit for bit.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline const float *at_position(const float *base, int64_t index, int64_t start, const int64_t *path,
                                       int64_t position_stride) {
    return base + (index < start ? index : start + path[index - start]) * position_stride;
}

/* A dot product on four independent sums (one would wait on each add's latency), then the tail one by one. */
static inline float dot(const float *a, const float *b, int64_t n) {
    __m256 sums[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t c = 0;
    for (; c + 32 <= n; c += 32)
        for (int j = 0; j < 4; j++)
            sums[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + c + 8 * j), _mm256_loadu_ps(b + c + 8 * j), sums[j]);
    __m256 sum = _mm256_add_ps(_mm256_add_ps(sums[0], sums[1]), _mm256_add_ps(sums[2], sums[3]));
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    half = _mm_add_ss(half, _mm_movehdup_ps(half));
    float total = _mm_cvtss_f32(half);
    for (; c < n; c++) total += a[c] * b[c];
    return total;
}

/* out[0:width] = the scores-weighted sum of the values' columns [column, column + width), width <= 64: eight
 * sums held in registers across all the keys. */
static inline void weighted_columns(const float *values, int64_t low, int64_t count, int64_t start,
                                    const int64_t *path, int64_t position_stride, const float *scores, int64_t column,
                                    int64_t width, float *out) {
    if (width == 64) {
        __m256 sums[8];
        for (int j = 0; j < 8; j++) sums[j] = _mm256_setzero_ps();
        for (int64_t i = 0; i < count; i++) {
            const float *value = at_position(values, low + i, start, path, position_stride) + column;
            const __m256 weight = _mm256_set1_ps(scores[i]);
            for (int j = 0; j < 8; j++) sums[j] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(value + 8 * j), sums[j]);
        }
        for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + 8 * j, sums[j]);
        return;
    }
    for (int64_t c = 0; c < width; c++) out[c] = 0.0f;
    for (int64_t i = 0; i < count; i++) {
        const float *value = at_position(values, low + i, start, path, position_stride) + column;
        for (int64_t c = 0; c < width; c++) out[c] += scores[i] * value[c];
    }
}

static void attend_one(const float *query, const float *keys, const float *values, int64_t position_stride,
                       int64_t dim, int64_t start, const int64_t *path, int64_t path_length, int64_t window,
                       float scale, float cap, float *out, float *scores) {
    const int64_t total = start + path_length;
    const int64_t low = (window > 0 && total > window) ? total - window : 0;
    const int64_t count = total - low;
    float largest = -INFINITY;
    for (int64_t i = 0; i < count; i++) {
        float score = dot(query, at_position(keys, low + i, start, path, position_stride), dim) * scale;
        if (cap > 0.0f) score = tanhf(score / cap) * cap;
        scores[i] = score;
        if (score > largest) largest = score;
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < count; i++) {
        scores[i] = expf(scores[i] - largest);
        sum += scores[i];
    }
    for (int64_t column = 0; column < dim; column += 64) {
        const int64_t width = dim - column < 64 ? dim - column : 64;
        weighted_columns(values, low, count, start, path, position_stride, scores, column, width, out + column);
    }
    const float inverse = 1.0f / sum;
    for (int64_t c = 0; c < dim; c++) out[c] *= inverse;
}

/* queries [heads, rows, dim] at the given strides; keys and values [kv_heads, positions, dim] at theirs, the last
 * dimension contiguous; paths: row r's path is paths[path_starts[r] .. path_starts[r + 1]] (row indices, its
 * own last); out [heads, rows, dim] contiguous. Returns 0, or -1 where a buffer for the scores ran out. */
int attend_rows(const float *queries, int64_t query_head_stride, int64_t query_row_stride, const float *keys,
                const float *values, int64_t kv_head_stride, int64_t position_stride, int64_t rows, int64_t heads,
                int64_t kv_heads, int64_t dim, int64_t start, const int64_t *path_starts, const int64_t *paths,
                int64_t window, float scale, float cap, float *out) {
    const int64_t group = heads / kv_heads;
    int failed = 0;
#pragma omp parallel
    {
        float *scores = malloc((size_t)(start + rows) * sizeof(float));
        if (scores == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t item = 0; item < rows * heads; item++) {
            if (scores == NULL) continue;
            const int64_t row = item / heads, head = item % heads, kv_head = head / group;
            const int64_t *path = paths + path_starts[row];
            attend_one(queries + head * query_head_stride + row * query_row_stride, keys + kv_head * kv_head_stride,
                       values + kv_head * kv_head_stride, position_stride, dim, start, path,
                       path_starts[row + 1] - path_starts[row], window, scale, cap, out + (head * rows + row) * dim,
                       scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
