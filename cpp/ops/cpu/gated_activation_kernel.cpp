// swiglu / geglu CPU kernels; compiled once per CPU capability
// (FuseopsCpuKernels.cmake). Every tensor is a [rows, H] view with
// contiguous rows (see ops/gated_activation.h).

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include "ops/cpu/activation_math.h"
#include "ops/cpu/elementwise.h"
#include "ops_generated/cpu/gated_activation.h"

namespace fuseops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// Row pointer arithmetic of one [rows, H] view.
template <typename T>
struct Rows {
  T* data;
  int64_t stride;
  T* at(int64_t row, int64_t col) const { return data + row * stride + col; }
};

template <typename scalar_t>
Rows<const scalar_t> rows_of(const at::Tensor& t) {
  return {t.const_data_ptr<scalar_t>(), t.stride(0)};
}

template <typename scalar_t>
Rows<scalar_t> mutable_rows_of(const at::Tensor& t) {
  return {t.mutable_data_ptr<scalar_t>(), t.stride(0)};
}

void gated_kernel_impl(const at::Tensor& out, const at::Tensor& gate, const at::Tensor& up,
                       Activation activation) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, gate.scalar_type(), "fuseops::gated_activation", [&] {
        using Block = OpmathBlock<scalar_t>;
        const auto out_rows = mutable_rows_of<scalar_t>(out);
        const auto gate_rows = rows_of<scalar_t>(gate);
        const auto up_rows = rows_of<scalar_t>(up);
        dispatch_activation(activation, [&](auto act) {
          parallel_rows(gate.size(0), gate.size(1), kElementwiseGrain,
                        [&](int64_t row, int64_t begin, int64_t end) {
                          const scalar_t* g = gate_rows.at(row, begin);
                          const scalar_t* u = up_rows.at(row, begin);
                          scalar_t* y = out_rows.at(row, begin);
                          for_each_block<Block::kSize>(end - begin, [&](int64_t i, int64_t n) {
                            auto a = Block::load(g + i, n);
                            const auto b = Block::load(u + i, n);
                            for (int r = 0; r < Block::kRegisters; ++r) {
                              a[r] = activation_value<decltype(act)::value>(a[r]) * b[r];
                            }
                            Block::store(y + i, a, n);
                          });
                        });
        });
      });
}

// grad_gate = grad * up * f'(gate), grad_up = grad * f(gate): one pass,
// f and f' sharing their transcendental.
void gated_backward_kernel_impl(const at::Tensor& grad_gate, const at::Tensor& grad_up,
                                const at::Tensor& grad_output, const at::Tensor& gate,
                                const at::Tensor& up, Activation activation) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, gate.scalar_type(), "fuseops::gated_activation_backward", [&] {
        using Block = OpmathBlock<scalar_t>;
        const auto grad_gate_rows = mutable_rows_of<scalar_t>(grad_gate);
        const auto grad_up_rows = mutable_rows_of<scalar_t>(grad_up);
        const auto grad_rows = rows_of<scalar_t>(grad_output);
        const auto gate_rows = rows_of<scalar_t>(gate);
        const auto up_rows = rows_of<scalar_t>(up);
        dispatch_activation(activation, [&](auto act) {
          parallel_rows(gate.size(0), gate.size(1), kElementwiseGrain,
                        [&](int64_t row, int64_t begin, int64_t end) {
                          const scalar_t* go = grad_rows.at(row, begin);
                          const scalar_t* g = gate_rows.at(row, begin);
                          const scalar_t* u = up_rows.at(row, begin);
                          scalar_t* gg = grad_gate_rows.at(row, begin);
                          scalar_t* gu = grad_up_rows.at(row, begin);
                          for_each_block<Block::kSize>(end - begin, [&](int64_t i, int64_t n) {
                            const auto grad = Block::load(go + i, n);
                            const auto a = Block::load(g + i, n);
                            const auto b = Block::load(u + i, n);
                            typename Block::Registers d_gate;
                            typename Block::Registers d_up;
                            for (int r = 0; r < Block::kRegisters; ++r) {
                              const auto derivative =
                                  activation_derivative<decltype(act)::value, true>(a[r], &d_up[r]);
                              d_gate[r] = grad[r] * b[r] * derivative;
                              d_up[r] = grad[r] * d_up[r];
                            }
                            Block::store(gg + i, d_gate, n);
                            Block::store(gu + i, d_up, n);
                          });
                        });
        });
      });
}

}  // namespace

FUSEOPS_REGISTER_CPU_KERNEL(GatedActivationCpuKernels::forward, &gated_kernel_impl);
FUSEOPS_REGISTER_CPU_KERNEL(GatedActivationCpuKernels::backward, &gated_backward_kernel_impl);

}  // namespace CPU_CAPABILITY
}  // namespace fuseops::cpu
