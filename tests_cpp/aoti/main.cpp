// Loads an AOTInductor package (torch._inductor.aoti_compile_and_package)
// whose model calls fuseops ops and runs it on one float32 input:
//   aoti_run PACKAGE INPUT OUTPUT D0 [D1 ...]
// reads INPUT as raw float32 of shape (D0, D1, ...), writes the model's first
// output to OUTPUT as raw float32, and prints its shape.
//
// The package's generated code calls the fuseops ops through the dispatcher
// (the proxy executor), so libfuseops must be loaded for them to exist: the
// fuseops::build_info() call below makes this program reference the library,
// so a linker that drops unreferenced libraries (--as-needed) keeps it.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <vector>

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <fuseops/fuseops.h>

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: aoti_run PACKAGE INPUT OUTPUT D0 [D1 ...]\n";
    return 2;
  }
  std::vector<int64_t> shape;
  for (int i = 4; i < argc; ++i) {
    shape.push_back(std::atoll(argv[i]));
  }
  at::Tensor input = at::empty(shape, at::kFloat);
  std::ifstream in(argv[2], std::ios::binary);
  in.read(reinterpret_cast<char*>(input.data_ptr<float>()), input.nbytes());
  if (!in) {
    std::cerr << "cannot read " << input.nbytes() << " bytes from " << argv[2] << "\n";
    return 1;
  }

  std::cout << "fuseops " << fuseops::build_info().version << "\n";
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  const std::vector<at::Tensor> outputs = loader.run({input});
  const at::Tensor out = outputs.at(0).contiguous().to(at::kFloat);

  std::ofstream result(argv[3], std::ios::binary);
  result.write(reinterpret_cast<const char*>(out.data_ptr<float>()), out.nbytes());
  std::cout << "output " << out.sizes() << "\n";
  return result ? 0 : 1;
}
