# Locating LibTorch through the Python `torch` package, shared by the fuseops
# build and by the installed fuseopsConfig.cmake.
#
# Why through Python: the wheel's libfuseops.so must link exactly the torch
# that will import it, and `torch.utils.cmake_prefix_path` of the interpreter
# that will run it is the only reliable way to find that torch's CMake config.

# fuseops_locate_torch(<python-executable>)
#   Prepends the torch package's CMake prefix to CMAKE_PREFIX_PATH (parent
#   scope) and sets FUSEOPS_TORCH_VERSION, FUSEOPS_TORCH_CUDA_VERSION (empty for
#   a CPU-only torch) and FUSEOPS_TORCH_PACKAGE_DIR.
function(fuseops_locate_torch python)
  execute_process(
    COMMAND "${python}" -c
      "import torch, torch.utils, os; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(torch.version.cuda or ''); print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err
    RESULT_VARIABLE rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR
      "fuseops: cannot import torch with ${python}:\n${err}\n"
      "Install torch into that environment first. With pip, build fuseops "
      "with `pip install --no-build-isolation .` so that it is built against "
      "the torch that will import it.")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  list(GET lines 0 prefix)
  list(GET lines 1 version)
  list(GET lines 2 cuda)
  list(GET lines 3 package_dir)
  set(CMAKE_PREFIX_PATH "${prefix};${CMAKE_PREFIX_PATH}" PARENT_SCOPE)
  set(FUSEOPS_TORCH_VERSION "${version}" PARENT_SCOPE)
  set(FUSEOPS_TORCH_CUDA_VERSION "${cuda}" PARENT_SCOPE)
  set(FUSEOPS_TORCH_PACKAGE_DIR "${package_dir}" PARENT_SCOPE)
endfunction()

# fuseops_prepare_torch_cuda(<torch-package-dir>)
#   Works around two gaps between pip's CUDA torch and a minimal CUDA toolkit:
#   Caffe2's config insists on libnvrtc, and torch's CUDA headers include
#   cusparse.h; both ship in the nvidia/cu* wheels next to torch.
macro(fuseops_prepare_torch_cuda package_dir)
  get_filename_component(_fuseops_site "${package_dir}" DIRECTORY)
  file(GLOB _fuseops_nvidia_libs "${_fuseops_site}/nvidia/cu*/lib")
  file(GLOB _fuseops_nvidia_includes "${_fuseops_site}/nvidia/cu*/include")
  if(NOT CUDA_nvrtc_LIBRARY)
    foreach(_dir IN LISTS _fuseops_nvidia_libs)
      file(GLOB _fuseops_nvrtc "${_dir}/libnvrtc.so*")
      if(_fuseops_nvrtc)
        list(GET _fuseops_nvrtc 0 _fuseops_nvrtc)
        set(CUDA_nvrtc_LIBRARY "${_fuseops_nvrtc}" CACHE FILEPATH "libnvrtc used by Caffe2's CMake config")
        break()
      endif()
    endforeach()
  endif()
  set(FUSEOPS_TORCH_CUDA_EXTRA_INCLUDES ${_fuseops_nvidia_includes})
endmacro()
