#pragma once
// causal_conv1d's width and activation as compile-time constants, for the
// kernels of every backend (host code: the CPU kernels, the CUDA launches).

#include <cstdint>
#include <type_traits>

namespace fuseops::detail {

// Calls fn(std::integral_constant<int, width>, std::bool_constant<silu>)
// for width 2, 3 or 4 (the checks allow no other).
template <typename Fn>
void dispatch_width_silu(int64_t width, bool silu, const Fn& fn) {
  auto with_silu = [&](auto w) {
    if (silu) {
      fn(w, std::true_type{});
    } else {
      fn(w, std::false_type{});
    }
  };
  switch (width) {
    case 2:
      with_silu(std::integral_constant<int, 2>{});
      break;
    case 3:
      with_silu(std::integral_constant<int, 3>{});
      break;
    default:
      with_silu(std::integral_constant<int, 4>{});
      break;
  }
}

}  // namespace fuseops::detail
