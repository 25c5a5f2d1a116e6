#pragma once
// What every file of cpp/ops/autograd/ writes its torch::autograd::Functions
// with, named once.

#include <torch/csrc/autograd/custom_function.h>

namespace fuseops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

}  // namespace fuseops
