// gelu / silu / bias_gelu CPU kernels; compiled once per CPU capability
// (FuseopsCpuKernels.cmake).

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "ops_generated/cpu/activation.h"
#include "ops/cpu/activation_math.h"
#include "ops/cpu/elementwise.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

#define FUSEOPS_DISPATCH_FLOATING(dtype, name, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, name, __VA_ARGS__)

void activation_kernel_impl(const at::Tensor& out, const at::Tensor& input, Activation activation) {
  FUSEOPS_DISPATCH_FLOATING(input.scalar_type(), "fuseops::activation", [&] {
    dispatch_activation(activation, [&](auto act) {
      parallel_map([](auto x) { return activation_value<decltype(act)::value>(x); },
                   out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
                   input.numel());
    });
  });
}

void activation_backward_kernel_impl(const at::Tensor& grad_input, const at::Tensor& grad_output,
                                     const at::Tensor& input, Activation activation) {
  FUSEOPS_DISPATCH_FLOATING(input.scalar_type(), "fuseops::activation_backward", [&] {
    dispatch_activation(activation, [&](auto act) {
      parallel_map2(
          [](auto grad, auto x) {
            return grad * activation_derivative<decltype(act)::value, false>(x, nullptr);
          },
          grad_input.mutable_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(),
          input.const_data_ptr<scalar_t>(), input.numel());
    });
  });
}

void bias_gelu_kernel_impl(const at::Tensor& out, const at::Tensor& input, const at::Tensor& bias,
                           Activation activation) {
  FUSEOPS_DISPATCH_FLOATING(input.scalar_type(), "fuseops::bias_gelu", [&] {
    using Block = OpmathBlock<scalar_t>;
    const int64_t cols = bias.numel();
    const int64_t rows = input.numel() / cols;
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    const scalar_t* in_data = input.const_data_ptr<scalar_t>();
    const scalar_t* bias_data = bias.const_data_ptr<scalar_t>();
    dispatch_activation(activation, [&](auto act) {
      parallel_rows(rows, cols, kElementwiseGrain, [&](int64_t row, int64_t begin, int64_t end) {
        const scalar_t* x_row = in_data + row * cols + begin;
        const scalar_t* b_row = bias_data + begin;
        scalar_t* y_row = out_data + row * cols + begin;
        for_each_block<Block::kSize>(end - begin, [&](int64_t i, int64_t count) {
          auto x = Block::load(x_row + i, count);
          const auto b = Block::load(b_row + i, count);
          for (int r = 0; r < Block::kRegisters; ++r) {
            x[r] = activation_value<decltype(act)::value>(x[r] + b[r]);
          }
          Block::store(y_row + i, x, count);
        });
      });
    });
  });
}

// Rows are split into a fixed number of chunks (independent of the thread
// count, so results are reproducible); each chunk sums its grad_input rows
// into its own opmath row of `partial` while writing grad_input, and the
// chunks' rows are added in order at the end.
constexpr int64_t kMaxBiasChunks = 64;

void bias_gelu_backward_kernel_impl(const at::Tensor& grad_input, const at::Tensor& grad_bias,
                                    const at::Tensor& grad_output, const at::Tensor& input,
                                    const at::Tensor& bias, Activation activation) {
  FUSEOPS_DISPATCH_FLOATING(input.scalar_type(), "fuseops::bias_gelu_backward", [&] {
    using Block = OpmathBlock<scalar_t>;
    using opmath_t = typename Block::opmath_t;
    using Vec = typename Block::Vec;
    const int64_t cols = bias.numel();
    const int64_t rows = input.numel() / cols;
    const int64_t min_rows_per_chunk = std::max<int64_t>(1, kElementwiseGrain / cols);
    const int64_t rows_per_chunk =
        std::max(min_rows_per_chunk, (rows + kMaxBiasChunks - 1) / kMaxBiasChunks);
    const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    at::Tensor partial =
        at::empty({chunks, cols}, input.options().dtype(c10::CppTypeToScalarType<opmath_t>::value));
    opmath_t* partial_data = partial.mutable_data_ptr<opmath_t>();

    scalar_t* gi_data = grad_input.mutable_data_ptr<scalar_t>();
    const scalar_t* go_data = grad_output.const_data_ptr<scalar_t>();
    const scalar_t* in_data = input.const_data_ptr<scalar_t>();
    const scalar_t* bias_data = bias.const_data_ptr<scalar_t>();
    constexpr int64_t kVecSize = Vec::size();

    dispatch_activation(activation, [&](auto act) {
      at::parallel_for(0, chunks, 1, [&](int64_t chunk_begin, int64_t chunk_end) {
        for (int64_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
          opmath_t* acc = partial_data + chunk * cols;
          std::fill(acc, acc + cols, opmath_t(0));
          const int64_t row_end = std::min(rows, (chunk + 1) * rows_per_chunk);
          for (int64_t row = chunk * rows_per_chunk; row < row_end; ++row) {
            const int64_t offset = row * cols;
            for_each_block<Block::kSize>(cols, [&](int64_t i, int64_t count) {
              const auto x = Block::load(in_data + offset + i, count);
              const auto b = Block::load(bias_data + i, count);
              auto g = Block::load(go_data + offset + i, count);
              for (int r = 0; r < Block::kRegisters; ++r) {
                g[r] =
                    g[r] * activation_derivative<decltype(act)::value, false>(x[r] + b[r], nullptr);
                // Lanes past `count` hold zeros; never add them into acc.
                const int64_t lanes = std::min<int64_t>(kVecSize, count - r * kVecSize);
                if (lanes > 0) {
                  opmath_t* a = acc + i + r * kVecSize;
                  (Vec::loadu(a, lanes) + g[r]).store(a, lanes);
                }
              }
              Block::store(gi_data + offset + i, g, count);
            });
          }
        }
      });
    });

    at::Tensor total = chunks == 1 ? partial[0] : partial.sum(0);
    grad_bias.copy_(total);
  });
}

#undef FUSEOPS_DISPATCH_FLOATING

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(ActivationCpuKernels::forward, &activation_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(ActivationCpuKernels::backward, &activation_backward_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(ActivationCpuKernels::bias_gelu, &bias_gelu_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(ActivationCpuKernels::bias_gelu_backward,
                            &bias_gelu_backward_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
