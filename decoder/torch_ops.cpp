// Our two C kernels (int8_rows.c, attend_rows.c) as torch operators, for the compiled step: AOTInductor calls an
// operator registered here from C++, where a Python one (kernels.opaque_linear, lean_forward.attend_tree_rows)
// costs a trip through Python on each of a step's ~90 calls. The kernels are built on their own, with their ISA
// flags, and handed in by address (specdec_set_kernels), so this file needs torch's headers and nothing else.
// The operators' schemas and shapes are defined in torch_ops.py; this file gives their CPU kernels.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>
#include <vector>

using Int8Rows = void (*)(const float* x, int64_t rows, int64_t k_len, const int8_t* w, const int32_t* wsum,
                          int64_t n_len, float* out, uint8_t* shifted);
using AttendRows = int (*)(const float* queries, int64_t query_head_stride, int64_t query_row_stride,
                           const float* keys, const float* values, int64_t kv_head_stride, int64_t position_stride,
                           int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, int64_t start,
                           const int64_t* path_starts, const int64_t* paths, int64_t window, float scale, float cap,
                           float* out);

static Int8Rows int8_rows_kernel = nullptr;
static int64_t int8_rows_tile = 1, int8_rows_chunk = 1;  // the weight layout it reads (int8_rows.laid_out)
static AttendRows attend_rows_kernel = nullptr;

extern "C" void specdec_set_kernels(void* int8_rows, int64_t tile, int64_t chunk, void* attend_rows) {
  int8_rows_kernel = reinterpret_cast<Int8Rows>(int8_rows);
  int8_rows_tile = tile;
  int8_rows_chunk = chunk;
  attend_rows_kernel = reinterpret_cast<AttendRows>(attend_rows);
}

// int8_rows.products: x [rows, in] float32 holding integers in [-127, 127], weight int8 as int8_rows.laid_out gives
// it ([tiles, chunks, tile, chunk]), sums [out] int32 -> [rows, out] float32, the exact int32 sums converted once.
static at::Tensor int8_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& sums) {
  TORCH_CHECK(int8_rows_kernel, "specdec::int8_rows: the int8 rows kernel is not loaded");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 4 && weight.scalar_type() == at::kChar && weight.is_contiguous() &&
                  sums.is_contiguous() && weight.size(0) == (sums.size(0) + int8_rows_tile - 1) / int8_rows_tile &&
                  weight.size(1) == (x.size(1) + int8_rows_chunk - 1) / int8_rows_chunk &&
                  weight.size(2) == int8_rows_tile && weight.size(3) == int8_rows_chunk,
              "specdec::int8_rows: a weight not laid out as int8_rows.laid_out gives it");
  const at::Tensor rows = x.contiguous();
  at::Tensor out = at::empty({rows.size(0), sums.size(0)}, rows.options());
  at::Tensor scratch = at::empty({rows.size(0) * weight.size(1) * weight.size(3)}, rows.options().dtype(at::kByte));
  int8_rows_kernel(rows.data_ptr<float>(), rows.size(0), rows.size(1), weight.data_ptr<int8_t>(),
                   sums.data_ptr<int32_t>(), sums.size(0), out.data_ptr<float>(), scratch.data_ptr<uint8_t>());
  return out;
}

// attend_rows.attend: queries [1, heads, rows, dim]; keys and values [1, kv_heads, positions, dim], holding `start`
// cached tokens and then the rows'; parents[row] the row before it on its path (-1: none) -> [1, heads, rows, dim].
static at::Tensor attend_rows(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                              int64_t start, const at::Tensor& parents, std::optional<int64_t> window, double scale,
                              std::optional<double> cap) {
  TORCH_CHECK(attend_rows_kernel, "specdec::attend_rows: the attention rows kernel is not loaded");
  const int64_t heads = queries.size(1), rows = queries.size(2), dim = queries.size(3), kv_heads = keys.size(1);
  TORCH_CHECK(heads % kv_heads == 0 && keys.strides() == values.strides() && keys.stride(3) == 1 &&
                  queries.stride(3) == 1 && keys.size(2) >= start + rows && parents.numel() == rows,
              "specdec::attend_rows: shapes or strides it cannot read");
  // each row's path, root first: its parent's path and then itself (tree.paths_of)
  const at::Tensor parent_rows = parents.contiguous();
  const int64_t* parent = parent_rows.data_ptr<int64_t>();
  std::vector<int64_t> path_starts{0}, paths;
  for (int64_t row = 0; row < rows; ++row) {
    TORCH_CHECK(parent[row] < row, "specdec::attend_rows: a row's parent comes after it");
    if (parent[row] >= 0)
      paths.insert(paths.end(), paths.begin() + path_starts[parent[row]], paths.begin() + path_starts[parent[row] + 1]);
    paths.push_back(row);
    path_starts.push_back(static_cast<int64_t>(paths.size()));
  }
  at::Tensor out = at::empty({1, heads, rows, dim}, queries.options());
  const int failed = attend_rows_kernel(
      queries.data_ptr<float>(), queries.stride(1), queries.stride(2), keys.data_ptr<float>(),
      values.data_ptr<float>(), keys.stride(1), keys.stride(2), rows, heads, kv_heads, dim, start, path_starts.data(),
      paths.data(), window.value_or(0), static_cast<float>(scale), static_cast<float>(cap.value_or(0.0)),
      out.data_ptr<float>());
  TORCH_CHECK(!failed, "specdec::attend_rows: no memory for the scores");
  return out;
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("int8_rows", int8_rows);
  m.impl("attend_rows", attend_rows);
}
