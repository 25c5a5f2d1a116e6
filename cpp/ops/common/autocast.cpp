#include "ops/common/autocast.h"

#include <memory>
#include <vector>

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace fuseops::detail {
namespace {

// One boxed kernel for every op: casts the tensor arguments on the stack,
// then calls the op again with this device's autocast key excluded (as
// PyTorch's own autocast kernels do), so autograd records the casts and the
// op sees the cast tensors.
class AutocastKernel final : public c10::OperatorKernel {
 public:
  AutocastKernel(c10::DeviceType device, AutocastCast cast) : device_(device), cast_(cast) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t num_args = op.schema().arguments().size();
    const auto args = stack->end() - static_cast<std::ptrdiff_t>(num_args);
    const at::ScalarType target = target_dtype(op, args, stack->end());
    for (auto arg = args; arg != stack->end(); ++arg) {
      if (skipped(op, args, arg)) {
        continue;
      }
      if (arg->isTensor()) {
        *arg = at::autocast::cached_cast(target, arg->toTensor(), device_);
      } else if (arg->isTensorList()) {
        std::vector<at::Tensor> cast;
        for (const at::Tensor& t : arg->toTensorVector()) {
          cast.push_back(at::autocast::cached_cast(target, t, device_));
        }
        *arg = c10::IValue(cast);
      }
    }
    c10::impl::ExcludeDispatchKeyGuard no_autocast(
        at::autocast::get_autocast_dispatch_key_from_device_type(device_));
    op.callBoxed(stack);
    if (cast_ == AutocastCast::kLinearLoss) {
      const size_t num_returns = op.schema().returns().size();
      for (auto ret = stack->end() - static_cast<std::ptrdiff_t>(num_returns); ret != stack->end();
           ++ret) {
        if (ret->isTensor() && at::autocast::is_eligible(ret->toTensor(), device_)) {
          *ret = ret->toTensor().to(at::kFloat);
        }
      }
    }
  }

 private:
  bool skipped(const c10::OperatorHandle& op, torch::jit::Stack::iterator first,
               torch::jit::Stack::iterator arg) const {
    const std::string& name = op.schema().arguments()[arg - first].name();
    switch (cast_) {
      case AutocastCast::kPromote:
        return name == "weight";
      case AutocastCast::kLinearLoss:
        // A linear layer's tensors, or each of fused_linear_jsd's two.
        return name != "input" && name != "weight" && name != "bias" && name != "student_input" &&
               name != "student_weight" && name != "teacher_input" && name != "teacher_weight";
      default:
        return false;
    }
  }

  at::ScalarType target_dtype(const c10::OperatorHandle& op, torch::jit::Stack::iterator first,
                              torch::jit::Stack::iterator last) const {
    const at::ScalarType lower = at::autocast::get_autocast_dtype(device_);
    switch (cast_) {
      case AutocastCast::kLowerPrecision:
      case AutocastCast::kLinearLoss:
        return lower;
      case AutocastCast::kFloat32:
        return at::kFloat;
      case AutocastCast::kFirstInput:
        for (auto arg = first; arg != last; ++arg) {
          if (arg->isTensor() && at::autocast::is_eligible(arg->toTensor(), device_)) {
            return arg->toTensor().scalar_type();
          }
        }
        return lower;  // no eligible tensor: nothing is cast
      case AutocastCast::kPromote:
        break;
      case AutocastCast::kNone:
        TORCH_INTERNAL_ASSERT(false, "kNone registers no autocast kernel");
    }
    // kPromote: the autocast dtype unless an input is wider (float32, or a
    // second reduced type, which float32 holds both of).
    at::ScalarType widest = lower;
    auto consider = [&](const at::Tensor& t) {
      if (at::autocast::is_eligible(t, device_) && t.scalar_type() != widest) {
        widest = at::kFloat;
      }
    };
    for (auto arg = first; arg != last; ++arg) {
      if (skipped(op, first, arg)) {
        continue;
      }
      if (arg->isTensor()) {
        consider(arg->toTensor());
      } else if (arg->isTensorList()) {
        for (const at::Tensor& t : arg->toTensorVector()) {
          consider(t);
        }
      }
    }
    return widest;
  }

  c10::DeviceType device_;
  AutocastCast cast_;
};

}  // namespace

void register_autocast(torch::Library& m, const char* name, c10::DeviceType device,
                       AutocastCast cast) {
  if (cast == AutocastCast::kNone) {
    return;
  }
  m.impl(name,
         torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutocastKernel>(device, cast)));
}

}  // namespace fuseops::detail
