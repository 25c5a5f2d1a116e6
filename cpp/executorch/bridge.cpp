// The PyTorch half of fuseops' ExecuTorch kernel library (bridge.h): runs a
// fuseops op through the dispatcher on tensors that wrap ExecuTorch's memory
// (at::from_blob, no copy), writing its results into the outputs ExecuTorch
// planned, through the op's out= overload where it has one.

#include "bridge.h"

#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>

namespace fuseops::executorch_bridge {
namespace {

struct Op {
  c10::OperatorHandle functional;
  // The out= overload whose arguments are the functional one's followed by
  // one output per result, when the op has one.
  std::optional<c10::OperatorHandle> out;
  size_t arguments;
  size_t results;
};

std::mutex ops_mutex;
std::deque<Op> ops;  // a deque: call() reads entries while add_op appends

void write_error(char* error, size_t error_size, const std::string& message) {
  if (error_size == 0) return;
  std::snprintf(error, error_size, "%s", message.c_str());
}

at::Tensor wrap(const TensorView& view) {
  return at::from_blob(view.data, c10::IntArrayRef(view.sizes, view.dim),
                       c10::IntArrayRef(view.strides, view.dim),
                       at::TensorOptions().dtype(static_cast<c10::ScalarType>(view.dtype)));
}

c10::IValue to_ivalue(const Value& value) {
  switch (value.kind) {
    case ValueKind::None:
      return c10::IValue();
    case ValueKind::Tensor:
      return wrap(value.tensor);
    case ValueKind::Int:
      return value.integer;
    case ValueKind::Double:
      return value.real;
    case ValueKind::Bool:
      return value.boolean;
    case ValueKind::String:
      return std::string(value.text, value.length);
  }
  TORCH_CHECK(false, "unknown value kind ", static_cast<int>(value.kind));
}

std::string out_overload_name(const std::string& overload) {
  return overload.empty() ? "out" : overload + "_out";
}

bool is_out_overload_of(const c10::FunctionSchema& out, const c10::FunctionSchema& functional) {
  const auto& args = out.arguments();
  const auto& base = functional.arguments();
  if (args.size() != base.size() + functional.returns().size()) return false;
  for (size_t i = 0; i < base.size(); ++i) {
    if (args[i].name() != base[i].name() || *args[i].type() != *base[i].type()) return false;
  }
  for (size_t i = base.size(); i < args.size(); ++i) {
    if (!args[i].is_out() || args[i].type()->kind() != c10::TypeKind::TensorType) return false;
  }
  return true;
}

}  // namespace

int add_op(const char* op, const char* overload, char* error, size_t error_size) {
  try {
    const std::string name = std::string("fuseops::") + op;
    auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
    TORCH_CHECK(handle.has_value(), "no op ", name, overload[0] ? "." : "", overload);
    const auto& schema = handle->schema();
    TORCH_CHECK(!schema.returns().empty(), name, " returns nothing");
    for (const auto& result : schema.returns()) {
      TORCH_CHECK(result.type()->kind() == c10::TypeKind::TensorType && !result.alias_info(), name,
                  " returns something other than new tensors");
    }
    for (const auto& argument : schema.arguments()) {
      TORCH_CHECK(!argument.alias_info() || !argument.alias_info()->isWrite(), name,
                  " writes its argument ", argument.name());
    }
    std::optional<c10::OperatorHandle> out =
        c10::Dispatcher::singleton().findSchema({name, out_overload_name(overload)});
    if (out && !is_out_overload_of(out->schema(), schema)) out.reset();
    std::lock_guard<std::mutex> lock(ops_mutex);
    ops.push_back(Op{*handle, out, schema.arguments().size(), schema.returns().size()});
    return static_cast<int>(ops.size() - 1);
  } catch (const c10::Error& e) {
    // The message, without the C++ backtrace torch's errors carry.
    write_error(error, error_size, e.what_without_backtrace());
    return -1;
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
    return -1;
  }
}

size_t values_read(int slot) {
  std::lock_guard<std::mutex> lock(ops_mutex);
  if (slot < 0 || static_cast<size_t>(slot) >= ops.size()) return 0;
  return ops[slot].arguments + ops[slot].results;
}

bool call(int slot, const Value* values, size_t count, char* error, size_t error_size) {
  try {
    const Op* op;
    {
      std::lock_guard<std::mutex> lock(ops_mutex);
      TORCH_CHECK(slot >= 0 && static_cast<size_t>(slot) < ops.size(), "no op in slot ", slot);
      op = &ops[slot];
    }
    const auto& name = op->functional.schema().name();
    TORCH_CHECK(count >= op->arguments + op->results, name, ": ExecuTorch passed ", count,
                " values, the op needs ", op->arguments, " arguments and ", op->results,
                " outputs");
    // Inference only: the dispatcher skips autograd's kernels.
    c10::InferenceMode inference;
    std::vector<at::Tensor> outputs;
    for (size_t i = 0; i < op->results; ++i) {
      const Value& output = values[op->arguments + i];
      TORCH_CHECK(output.kind == ValueKind::Tensor, name, ": output ", i, " is not a tensor");
      outputs.push_back(wrap(output.tensor));
    }
    torch::jit::Stack stack;
    stack.reserve(op->arguments + op->results);
    for (size_t i = 0; i < op->arguments; ++i) stack.push_back(to_ivalue(values[i]));
    if (op->out) {
      for (const auto& output : outputs) stack.push_back(output);
      op->out->callBoxed(stack);
      return true;
    }
    op->functional.callBoxed(stack);
    TORCH_CHECK(stack.size() == op->results, name, " returned ", stack.size(), " values");
    for (size_t i = 0; i < op->results; ++i) {
      const at::Tensor result = stack[i].toTensor();
      // ExecuTorch sized the outputs when the program was exported; a result
      // of another shape means the program ran on inputs it was not made for.
      TORCH_CHECK(result.sizes() == outputs[i].sizes(), name, ": result ", i, " has shape ",
                  result.sizes(), ", the program planned ", outputs[i].sizes());
      outputs[i].copy_(result);
    }
    return true;
  } catch (const c10::Error& e) {
    // The message, without the C++ backtrace torch's errors carry.
    write_error(error, error_size, e.what_without_backtrace());
    return false;
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
    return false;
  }
}

}  // namespace fuseops::executorch_bridge
