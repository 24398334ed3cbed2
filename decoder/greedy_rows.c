/* A greedy round's decision over float32 logits rows (greedy_rows.py): each row's first maximum, and the
 * log-normalizer log(sum(exp(x))) of the rows committed.
 *
 * Each row is cut into one piece per thread; a piece's result does not depend on the others, and the pieces
 * are joined in order, so the first maximum is torch's argmax whatever the thread count. exp is a polynomial
 * (Cephes' expf: about 1e-7 relative) over x - max <= 0, summed in blocks whose float sums go to a double.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#define MOST_PIECES 64
#define BLOCK 1024 /* floats summed in float before their sum joins the double */

/* The larger of two (value, index) lane sets; on a tie the smaller index: the earlier position. */
static inline void join(__m256 *value, __m256i *index, __m256 other_value, __m256i other_index) {
    const __m256 greater = _mm256_cmp_ps(other_value, *value, _CMP_GT_OQ);
    const __m256 equal = _mm256_cmp_ps(other_value, *value, _CMP_EQ_OQ);
    const __m256 earlier = _mm256_castsi256_ps(_mm256_cmpgt_epi32(*index, other_index));
    const __m256 take = _mm256_or_ps(greater, _mm256_and_ps(equal, earlier));
    *value = _mm256_blendv_ps(*value, other_value, take);
    *index = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(*index), _mm256_castsi256_ps(other_index), take));
}

/* The first maximum of x[begin, end): its value and index. */
static void first_maximum(const float *x, int64_t begin, int64_t end, float *best_value, int64_t *best_index) {
    float value = -INFINITY;
    int64_t index = begin;
    int64_t i = begin;
    if (end - begin >= 32) {
        __m256 values[4];
        __m256i indices[4];
        const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (int j = 0; j < 4; j++) {
            values[j] = _mm256_set1_ps(-INFINITY);
            indices[j] = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(begin + 8 * j)), lanes);
        }
        /* each lane keeps its first maximum (a strict >): lane j of set s sees positions begin + 8s + j + 32k */
        for (; i + 32 <= end; i += 32)
            for (int j = 0; j < 4; j++) {
                const __m256 v = _mm256_loadu_ps(x + i + 8 * j);
                const __m256 greater = _mm256_cmp_ps(v, values[j], _CMP_GT_OQ);
                const __m256i at = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(i + 8 * j)), lanes);
                values[j] = _mm256_blendv_ps(values[j], v, greater);
                indices[j] = _mm256_castps_si256(
                    _mm256_blendv_ps(_mm256_castsi256_ps(indices[j]), _mm256_castsi256_ps(at), greater));
            }
        join(&values[0], &indices[0], values[1], indices[1]);
        join(&values[2], &indices[2], values[3], indices[3]);
        join(&values[0], &indices[0], values[2], indices[2]);
        float lane_values[8];
        int32_t lane_indices[8];
        _mm256_storeu_ps(lane_values, values[0]);
        _mm256_storeu_si256((__m256i *)lane_indices, indices[0]);
        for (int j = 0; j < 8; j++)
            if (lane_values[j] > value || (lane_values[j] == value && lane_indices[j] < index)) {
                value = lane_values[j];
                index = lane_indices[j];
            }
    }
    for (; i < end; i++) /* the tail comes after every lane's positions: only a larger value wins */
        if (x[i] > value) {
            value = x[i];
            index = i;
        }
    *best_value = value;
    *best_index = index;
}

/* exp(x) for x <= 0, 8 lanes: 2^n * e^f with n = round(x / ln 2), f = x - n ln 2 in two parts (Cephes). */
static inline __m256 exp_nonpositive(__m256 x) {
    /* below -87, e^x is under float's normal range: about 0 (a NaN stays one: max_ps returns its second operand) */
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(f, f), _mm256_add_ps(f, _mm256_set1_ps(1.0f)));
    const __m256i power = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(power));
}

/* sum(exp(x[i] - shift)) over [begin, end). */
static double exp_sum(const float *x, int64_t begin, int64_t end, float shift) {
    const __m256 by = _mm256_set1_ps(shift);
    double total = 0.0;
    int64_t i = begin;
    while (end - i >= 32) {
        const int64_t stop = i + BLOCK <= end ? i + BLOCK : end - (end - i) % 32;
        __m256 sums[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (; i < stop; i += 32)
            for (int j = 0; j < 4; j++)
                sums[j] = _mm256_add_ps(sums[j], exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * j), by)));
        float lanes[8];
        _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(sums[0], sums[1]), _mm256_add_ps(sums[2], sums[3])));
        for (int j = 0; j < 8; j++) total += lanes[j];
    }
    for (; i < end; i++) total += expf(x[i] - shift);
    return total;
}

static int pieces_for(int64_t vocab) {
    int threads = omp_get_max_threads();
    if (threads > MOST_PIECES) threads = MOST_PIECES;
    if (threads < 1) threads = 1;
    return vocab >= 4096 * threads ? threads : 1;
}

/* index[r], maximum[r]: the first maximum of row r of `rows` rows of `vocab` logits, `stride` floats apart. */
void row_first_maxima(const float *logits, int64_t rows, int64_t vocab, int64_t stride, int64_t *index,
                      float *maximum) {
    const int pieces = pieces_for(vocab);
    float *values = malloc(sizeof(float) * rows * pieces);
    int64_t *indices = malloc(sizeof(int64_t) * rows * pieces);
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < rows * pieces; item++) {
        const int64_t row = item / pieces, piece = item % pieces;
        first_maximum(logits + row * stride, vocab * piece / pieces, vocab * (piece + 1) / pieces, values + item,
                      indices + item);
    }
    for (int64_t row = 0; row < rows; row++) {
        float value = values[row * pieces];
        int64_t at = indices[row * pieces];
        for (int piece = 1; piece < pieces; piece++) /* in order: a later piece wins only with a larger value */
            if (values[row * pieces + piece] > value) {
                value = values[row * pieces + piece];
                at = indices[row * pieces + piece];
            }
        maximum[row] = value;
        index[row] = at;
    }
    free(values);
    free(indices);
}

/* out[r] = log(sum(exp(row r))), given each row's maximum (row_first_maxima). */
void row_log_normalizers(const float *logits, int64_t rows, int64_t vocab, int64_t stride, const float *maximum,
                         float *out) {
    const int pieces = pieces_for(vocab);
    double *sums = malloc(sizeof(double) * rows * pieces);
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < rows * pieces; item++) {
        const int64_t row = item / pieces, piece = item % pieces;
        sums[item] = exp_sum(logits + row * stride, vocab * piece / pieces, vocab * (piece + 1) / pieces,
                             maximum[row]);
    }
    for (int64_t row = 0; row < rows; row++) {
        double total = 0.0;
        for (int piece = 0; piece < pieces; piece++) total += sums[row * pieces + piece];
        out[row] = (float)(maximum[row] + log(total));
    }
    free(sums);
}
