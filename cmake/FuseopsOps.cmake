# Op families, added by name.
#
#   fuseops_add_op(<name> [KERNELS <file stem>...])
#                                     once per op family, after add_library(fuseops);
#                                     KERNELS names the family's CPU kernel files
#                                     (cpp/ops/cpu/<stem>.cpp, each compiled once per
#                                     capability) when there are several; default
#                                     <name>_kernel
#   fuseops_write_umbrella_header()   once, after the last fuseops_add_op
#
# A family's files follow one naming convention (CONTRIBUTING.md, "Adding an op"),
# and fuseops_add_op checks that each exists:
#
#   cpp/include/fuseops/<name>.h    public C++ API
#   cpp/ops/<name>.cpp              schemas, C++ API, shared checks, Meta kernels
#   cpp/ops/cpu/<name>.cpp          CPU kernel tables and CPU registration
#   cpp/ops/cpu/<name>_kernel.cpp   CPU kernels, compiled once per capability
#   cpp/ops/autograd/<name>.cpp     Autograd kernels
#   cuda/<name>_kernel.cu           CUDA kernels and CUDA registration
#   python/csrc/<name>.cpp          its functions in the module fuseops._C
#   tests_cpp/<name>_test.cpp       GoogleTest tests
#
# Names are collected in the global property FUSEOPS_OPS, from which
# python/CMakeLists.txt and tests_cpp/CMakeLists.txt take the bindings and the
# tests, and fuseops_write_umbrella_header() the includes of fuseops/fuseops.h.

function(fuseops_add_op name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "KERNELS")
  if(NOT ARG_KERNELS)
    set(ARG_KERNELS ${name}_kernel)
  endif()
  set(files
    cpp/include/fuseops/${name}.h
    cpp/ops/${name}.cpp
    cpp/ops/cpu/${name}.cpp
    cpp/ops/autograd/${name}.cpp
    cuda/${name}_kernel.cu
    python/csrc/${name}.cpp
    tests_cpp/${name}_test.cpp)
  foreach(kernel IN LISTS ARG_KERNELS)
    list(APPEND files cpp/ops/cpu/${kernel}.cpp)
  endforeach()
  foreach(file IN LISTS files)
    if(NOT EXISTS "${PROJECT_SOURCE_DIR}/${file}")
      message(FATAL_ERROR "fuseops_add_op(${name}): ${file} is missing "
                          "(see \"Adding an op\" in CONTRIBUTING.md)")
    endif()
  endforeach()
  target_sources(fuseops PRIVATE
    "${PROJECT_SOURCE_DIR}/cpp/ops/${name}.cpp"
    "${PROJECT_SOURCE_DIR}/cpp/ops/cpu/${name}.cpp"
    "${PROJECT_SOURCE_DIR}/cpp/ops/autograd/${name}.cpp")
  foreach(kernel IN LISTS ARG_KERNELS)
    fuseops_add_cpu_kernel(fuseops "${PROJECT_SOURCE_DIR}/cpp/ops/cpu/${kernel}.cpp")
  endforeach()
  if(FUSEOPS_WITH_CUDA)
    target_sources(fuseops PRIVATE "${PROJECT_SOURCE_DIR}/cuda/${name}_kernel.cu")
  endif()
  set_property(GLOBAL APPEND PROPERTY FUSEOPS_OPS ${name})
endfunction()

# fuseops/fuseops.h includes every op's public header; it is written into the
# build tree (an include directory of the fuseops target) and installed with
# the other public headers.
function(fuseops_write_umbrella_header)
  get_property(ops GLOBAL PROPERTY FUSEOPS_OPS)
  set(headers build_info memory ${ops})
  list(SORT headers)
  set(FUSEOPS_UMBRELLA_INCLUDES "")
  foreach(header IN LISTS headers)
    string(APPEND FUSEOPS_UMBRELLA_INCLUDES "#include <fuseops/${header}.h>\n")
  endforeach()
  configure_file("${PROJECT_SOURCE_DIR}/cmake/fuseops.h.in"
    "${FUSEOPS_GENERATED_INCLUDE_DIR}/fuseops/fuseops.h" @ONLY)
endfunction()
