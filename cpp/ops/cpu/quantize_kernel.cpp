// int8 quantization CPU kernels; compiled once per CPU capability.
//
// quantize: one task owns whole rows (quantize_row.h), so the op streams
// its input once and its output once.

#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/int8_vec.h"
#include "ops_generated/cpu/quantize.h"
#include "ops/cpu/quantize_row.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

constexpr int64_t W = FloatVec::size();

int64_t quantize_rows_kernel_impl(const at::Tensor& q, const at::Tensor& scale,
                                  const at::Tensor& input) {
  const int64_t rows = scale.numel();
  const int64_t k = input.size(-1);
  int8_t* q_data = q.mutable_data_ptr<int8_t>();
  float* scale_data = scale.mutable_data_ptr<float>();
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, input.scalar_type(), "fuseops::quantize_int8", [&] {
        const scalar_t* in = input.const_data_ptr<scalar_t>();
        at::parallel_for(0, rows, row_grain(k), [&](int64_t begin, int64_t end) {
          std::vector<float> buffer;
          for (int64_t r = begin; r < end; ++r) {
            if (!quantize_row_int8<NonFiniteRow::kRefuse>(in + r * k, k, q_data + r * k,
                                                          scale_data + r, buffer)) {
              int64_t seen = first_bad.load();
              while (r < seen && !first_bad.compare_exchange_weak(seen, r)) {
              }
            }
          }
        });
      });
  const int64_t bad = first_bad.load();
  return bad == std::numeric_limits<int64_t>::max() ? -1 : bad;
}

// out[c] = q[c] * scale (kBroadcast) or q[c] * scale[c] for c in [begin, end).
template <bool kBroadcast, typename scalar_t>
void dequantize_span(scalar_t* out, const int8_t* q, const float* scale, int64_t begin,
                     int64_t end) {
  if constexpr (std::is_same_v<scalar_t, double>) {
    for (int64_t c = begin; c < end; ++c) {
      out[c] = static_cast<double>(q[c]) * static_cast<double>(kBroadcast ? scale[0] : scale[c]);
    }
  } else {
    using Block = OpmathBlock<scalar_t>;
    for_each_block<Block::kSize>(end - begin, [&](int64_t offset, int64_t count) {
      const int64_t c = begin + offset;
      typename Block::Registers regs;
      for (int r = 0; r < Block::kRegisters; ++r) {
        const int64_t lanes = std::max<int64_t>(0, std::min(W, count - r * W));
        const FloatVec s =
            kBroadcast ? FloatVec(scale[0]) : FloatVec::loadu(scale + c + r * W, lanes);
        regs[r] = load_int8_as_float(q + c + r * W, lanes) * s;
      }
      Block::store(out + c, regs, count);
    });
  }
}

void dequantize_kernel_impl(const at::Tensor& out, const at::Tensor& q, const at::Tensor& scale,
                            int64_t outer, int64_t size, int64_t inner) {
  const int8_t* q_data = q.const_data_ptr<int8_t>();
  const float* scale_data = scale.const_data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, out.scalar_type(), "fuseops::dequantize_int8", [&] {
        scalar_t* o = out.mutable_data_ptr<scalar_t>();
        if (inner == 1) {
          // One scale per row of `size` elements.
          parallel_rows(outer, size, kElementwiseGrain, [&](int64_t row, int64_t b, int64_t e) {
            dequantize_span<true>(o + row * size, q_data + row * size, scale_data + row, b, e);
          });
        } else {
          // Rows of `inner` elements; row (o, d) uses scale row o.
          parallel_rows(outer * size, inner, kElementwiseGrain,
                        [&](int64_t row, int64_t b, int64_t e) {
                          dequantize_span<false>(o + row * inner, q_data + row * inner,
                                                 scale_data + (row / size) * inner, b, e);
                        });
        }
      });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(QuantizeCpuKernels::quantize, &quantize_rows_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(QuantizeCpuKernels::dequantize, &dequantize_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
