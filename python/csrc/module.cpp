// fuseops._C: the C++ API (cpp/include/fuseops) bound for Python, plus build
// information. The public Python functions go through torch.ops instead
// (visible to torch.compile/export); these bindings exist so that the C++ API
// itself can be called and tested from Python.

#include <torch/csrc/utils/pybind.h>

#include <fuseops/fuseops.h>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "fuseops C++ API bindings";

  m.def("relu", &fuseops::relu, py::arg("input"));
  m.def("relu_out", &fuseops::relu_out, py::arg("input"), py::arg("out"));
  m.def("relu_backward", &fuseops::relu_backward, py::arg("grad_output"),
        py::arg("result"));

  m.def("rms_norm", &fuseops::rms_norm, py::arg("input"), py::arg("weight") = py::none(),
        py::arg("eps") = py::none());
  m.def("rms_norm_out", &fuseops::rms_norm_out, py::arg("input"), py::arg("weight"),
        py::arg("eps"), py::arg("out"));
  m.def("rms_norm_forward", &fuseops::rms_norm_forward, py::arg("input"),
        py::arg("weight") = py::none(), py::arg("eps") = py::none());
  m.def("rms_norm_backward", &fuseops::rms_norm_backward, py::arg("grad_output"),
        py::arg("input"), py::arg("weight"), py::arg("rstd"));
  m.def("fused_add_rms_norm", &fuseops::fused_add_rms_norm, py::arg("input"),
        py::arg("residual"), py::arg("weight") = py::none(), py::arg("eps") = py::none());
  m.def(
      "fused_add_rms_norm_out",
      [](const at::Tensor& input, const at::Tensor& residual,
         const std::optional<at::Tensor>& weight, std::optional<double> eps, at::Tensor& out,
         at::Tensor& residual_out) {
        fuseops::fused_add_rms_norm_out(input, residual, weight, eps, out, residual_out);
        return py::make_tuple(out, residual_out);
      },
      py::arg("input"), py::arg("residual"), py::arg("weight"), py::arg("eps"),
      py::arg("out"), py::arg("residual_out"));
  m.def("fused_add_rms_norm_forward", &fuseops::fused_add_rms_norm_forward, py::arg("input"),
        py::arg("residual"), py::arg("weight") = py::none(), py::arg("eps") = py::none());
  m.def("fused_add_rms_norm_backward", &fuseops::fused_add_rms_norm_backward,
        py::arg("grad_output"), py::arg("grad_new_residual"), py::arg("new_residual"),
        py::arg("weight"), py::arg("rstd"));

  m.def("layer_norm", &fuseops::layer_norm, py::arg("input"),
        py::arg("weight") = py::none(), py::arg("bias") = py::none(),
        py::arg("eps") = 1e-5);
  m.def("layer_norm_out", &fuseops::layer_norm_out, py::arg("input"), py::arg("weight"),
        py::arg("bias"), py::arg("eps"), py::arg("out"));
  m.def("layer_norm_forward", &fuseops::layer_norm_forward, py::arg("input"),
        py::arg("weight") = py::none(), py::arg("bias") = py::none(),
        py::arg("eps") = 1e-5);
  m.def("layer_norm_backward", &fuseops::layer_norm_backward, py::arg("grad_output"),
        py::arg("input"), py::arg("weight"), py::arg("mean"), py::arg("rstd"));

  m.def("gelu", &fuseops::gelu, py::arg("input"), py::arg("approximate") = "none");
  m.def("gelu_out", &fuseops::gelu_out, py::arg("input"), py::arg("approximate"),
        py::arg("out"));
  m.def("gelu_backward", &fuseops::gelu_backward, py::arg("grad_output"), py::arg("input"),
        py::arg("approximate") = "none");
  m.def("silu", &fuseops::silu, py::arg("input"));
  m.def("silu_out", &fuseops::silu_out, py::arg("input"), py::arg("out"));
  m.def("silu_backward", &fuseops::silu_backward, py::arg("grad_output"), py::arg("input"));
  m.def("bias_gelu", &fuseops::bias_gelu, py::arg("input"), py::arg("bias"),
        py::arg("approximate") = "none");
  m.def("bias_gelu_out", &fuseops::bias_gelu_out, py::arg("input"), py::arg("bias"),
        py::arg("approximate"), py::arg("out"));
  m.def("bias_gelu_backward", &fuseops::bias_gelu_backward, py::arg("grad_output"),
        py::arg("input"), py::arg("bias"), py::arg("approximate") = "none");

  m.def("swiglu", &fuseops::swiglu, py::arg("gate"), py::arg("up"));
  m.def("swiglu_out", &fuseops::swiglu_out, py::arg("gate"), py::arg("up"), py::arg("out"));
  m.def("swiglu_backward", &fuseops::swiglu_backward, py::arg("grad_output"), py::arg("gate"),
        py::arg("up"));
  m.def("swiglu_packed", &fuseops::swiglu_packed, py::arg("input"));
  m.def("swiglu_packed_out", &fuseops::swiglu_packed_out, py::arg("input"), py::arg("out"));
  m.def("swiglu_packed_backward", &fuseops::swiglu_packed_backward, py::arg("grad_output"),
        py::arg("input"));
  m.def("geglu", &fuseops::geglu, py::arg("gate"), py::arg("up"),
        py::arg("approximate") = "none");
  m.def("geglu_out", &fuseops::geglu_out, py::arg("gate"), py::arg("up"),
        py::arg("approximate"), py::arg("out"));
  m.def("geglu_backward", &fuseops::geglu_backward, py::arg("grad_output"), py::arg("gate"),
        py::arg("up"), py::arg("approximate") = "none");
  m.def("geglu_packed", &fuseops::geglu_packed, py::arg("input"),
        py::arg("approximate") = "none");
  m.def("geglu_packed_out", &fuseops::geglu_packed_out, py::arg("input"),
        py::arg("approximate"), py::arg("out"));
  m.def("geglu_packed_backward", &fuseops::geglu_packed_backward, py::arg("grad_output"),
        py::arg("input"), py::arg("approximate") = "none");

  m.def("build_info", [] {
    const fuseops::BuildInfo info = fuseops::build_info();
    py::dict d;
    d["version"] = info.version;
    d["torch_version"] = info.torch_version;
    d["cxx11_abi"] = info.cxx11_abi;
    d["cpu_capabilities"] = info.cpu_capabilities;
    d["runnable_cpu_capabilities"] = info.runnable_cpu_capabilities;
    d["selected_cpu_capability"] = info.selected_cpu_capability;
    d["cuda"] = info.cuda;
    d["cuda_version"] = info.cuda_version;
    d["cuda_architectures"] = info.cuda_architectures;
    return d;
  });
  m.def("cpu_kernel_calls", [] {
    py::dict d;
    for (const auto& [capability, calls] : fuseops::cpu_kernel_calls()) {
      d[py::str(capability)] = calls;
    }
    return d;
  });
}
