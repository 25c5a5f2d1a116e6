// The ExecuTorch half of fuseops' ExecuTorch kernel library: one ExecuTorch
// kernel per fuseops op, registered with ExecuTorch's operator registry as
// "fuseops_executorch::<op>.out" (the out variants fuseops.executorch gives
// the ops it keeps in a program). Each kernel converts its stack of
// ExecuTorch values to bridge.h's plain values and runs the fuseops op
// through bridge.cpp.
//
// ExecuTorch's kernels are plain function pointers without user data, so
// which op a kernel runs is its template argument: kSlots instances, the
// Nth running the op in bridge slot N.

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/log.h>

#include "bridge.h"

namespace {

namespace et = executorch::runtime;
namespace bridge = fuseops::executorch_bridge;

constexpr size_t kSlots = 256;

bool to_value(const et::EValue& in, bridge::Value& out, const char** why) {
  if (in.isNone()) {
    out.kind = bridge::ValueKind::None;
  } else if (in.isTensor()) {
    const auto& tensor = in.toTensor();
    if (tensor.dim() > bridge::kMaxDims) {
      *why = "a tensor has more dimensions than fuseops' ExecuTorch kernels take";
      return false;
    }
    out.kind = bridge::ValueKind::Tensor;
    out.tensor.data = tensor.mutable_data_ptr();
    out.tensor.dtype = static_cast<int32_t>(tensor.scalar_type());
    out.tensor.dim = static_cast<int32_t>(tensor.dim());
    for (ssize_t d = 0; d < tensor.dim(); ++d) {
      out.tensor.sizes[d] = tensor.size(d);
      out.tensor.strides[d] = tensor.strides()[d];
    }
  } else if (in.isInt()) {
    out.kind = bridge::ValueKind::Int;
    out.integer = in.toInt();
  } else if (in.isDouble()) {
    out.kind = bridge::ValueKind::Double;
    out.real = in.toDouble();
  } else if (in.isBool()) {
    out.kind = bridge::ValueKind::Bool;
    out.boolean = in.toBool();
  } else if (in.isString()) {
    const std::string_view text = in.toString();
    out.kind = bridge::ValueKind::String;
    out.text = text.data();
    out.length = text.size();
  } else {
    *why = "an argument of a type fuseops' ExecuTorch kernels do not take";
    return false;
  }
  return true;
}

void run(size_t slot, et::KernelRuntimeContext& context, et::Span<et::EValue*> stack) {
  // The results that follow the outputs (the same tensors, or a list of
  // them) are not read.
  const size_t count = std::min(bridge::values_read(static_cast<int>(slot)), stack.size());
  std::vector<bridge::Value> values(count);
  for (size_t i = 0; i < count; ++i) {
    const char* why = nullptr;
    if (!to_value(*stack[i], values[i], &why)) {
      ET_LOG(Error, "fuseops kernel in slot %zu, value %zu: %s", slot, i, why);
      context.fail(et::Error::InvalidArgument);
      return;
    }
  }
  char error[1024] = {};
  if (!bridge::call(static_cast<int>(slot), values.data(), values.size(), error, sizeof(error))) {
    ET_LOG(Error, "%s", error);
    context.fail(et::Error::InvalidArgument);
  }
}

template <size_t Slot>
void run_slot(et::KernelRuntimeContext& context, et::Span<et::EValue*> stack) {
  run(Slot, context, stack);
}

template <size_t... Slot>
constexpr std::array<et::OpFunction, sizeof...(Slot)> slot_table(std::index_sequence<Slot...>) {
  return {&run_slot<Slot>...};
}

constexpr auto kKernels = slot_table(std::make_index_sequence<kSlots>());

std::mutex registered_mutex;
// Kernel names must outlive the registry, which keeps the pointers.
std::deque<std::string> registered_names;

}  // namespace

// Registers fuseops::<op>.<overload> ("" for the default overload) with
// ExecuTorch as the kernel `kernel_name` ("fuseops_executorch::<name>.out").
// Returns 0, or -1 with `error` written. Called by fuseops.executorch
// (ctypes), once per op and process.
extern "C" __attribute__((visibility("default"))) int fuseops_executorch_register(
    const char* op, const char* overload, const char* kernel_name, char* error, size_t error_size) {
  std::lock_guard<std::mutex> lock(registered_mutex);
  const int slot = bridge::add_op(op, overload, error, error_size);
  if (slot < 0) return -1;
  if (static_cast<size_t>(slot) >= kSlots) {
    std::snprintf(error, error_size, "fuseops' ExecuTorch kernels hold at most %zu ops", kSlots);
    return -1;
  }
  registered_names.emplace_back(kernel_name);
  const et::Kernel kernel(registered_names.back().c_str(), kKernels[slot]);
  const et::Error status = et::register_kernels({&kernel, 1});
  if (status != et::Error::Ok) {
    std::snprintf(error, error_size, "ExecuTorch refused the kernel %s (error %d)", kernel_name,
                  static_cast<int>(status));
    return -1;
  }
  return 0;
}
