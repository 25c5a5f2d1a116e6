# Op families, added by name.
#
#   fuseops_add_op(<name> [KERNELS <file stem>...] [COMPOSITE])
#                                     once per op family, after add_library(fuseops);
#                                     KERNELS names the family's CPU kernel files
#                                     (cpp/ops/cpu/<stem>.cpp, each compiled once per
#                                     capability) when there are several; default
#                                     <name>_kernel. COMPOSITE: a family with no
#                                     kernels of its own (its ops call other ops, and
#                                     their gradients are those ops'), so it has no
#                                     contract header (cpp/ops/<name>.h) and no CPU,
#                                     CUDA or Autograd files
#   fuseops_write_umbrella_header()   once, after the last fuseops_add_op
#
# A family's files follow one naming convention (CONTRIBUTING.md, "Adding an op"),
# and fuseops_add_op checks that each exists:
#
#   cpp/include/fuseops/<name>.h    public C++ API
#   cpp/ops/<name>.yaml             the family's kernel types and operator
#                                   schemas, from which
#                                   cmake/generate_op_registrations.py writes
#                                   the definitions, register_<name>_kernels (which
#                                   <Name>Registrations::register_all calls), the
#                                   Meta registration, the CPU kernel tables
#                                   (<Name>CpuKernels), the CUDA kernel slots
#                                   (<Name>CudaKernels) and their registrations
#   cpp/ops/<name>.h                the contract every backend includes: kernel
#                                   types, <name>_with(...), <Name>Registrations
#   cpp/ops/<name>.cpp              C++ API, shared checks, composite_ops' kernels
#   cpp/ops/cpu/<name>_kernel.cpp   CPU kernels, compiled once per capability;
#                                   they fill <Name>CpuKernels
#                                   (ops_generated/cpu/<name>.h)
#   cpp/ops/autograd/<name>.cpp     Autograd kernels that are functions
#                                   (<Name>Autograd), when the declaration's
#                                   `autograd:` has any; the refusing ones
#                                   (no_derivative, inference) are generated
#   cuda/<name>_kernel.cu           CUDA kernels; they fill <Name>CudaKernels
#                                   (ops_generated/cuda/<name>.h), which the
#                                   generated CUDA registration hands the family
#   python/csrc/<name>.cpp          its functions in the module fuseops._C
#   tests_cpp/<name>_test.cpp       GoogleTest tests
#
# Names are collected in the global property FUSEOPS_OPS, from which
# python/CMakeLists.txt and tests_cpp/CMakeLists.txt take the bindings and the
# tests, and fuseops_write_umbrella_header() the includes of fuseops/fuseops.h.

# Writes the family's registration code from cpp/ops/<name>.yaml into
# FUSEOPS_OPS_GENERATED_DIR/ops_generated, a private include directory of the
# library (cmake/generate_op_registrations.py says which files).
# CMake configures again when the declaration or the generator changes.
function(_fuseops_generate_registrations name)
  set(declaration "${PROJECT_SOURCE_DIR}/cpp/ops/${name}.yaml")
  set(generator "${PROJECT_SOURCE_DIR}/cmake/generate_op_registrations.py")
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${generator}" ${name} "${declaration}"
            "${FUSEOPS_OPS_GENERATED_DIR}"
    RESULT_VARIABLE result
    ERROR_VARIABLE error)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "fuseops_add_op(${name}): ${error}")
  endif()
  set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY
    CMAKE_CONFIGURE_DEPENDS "${declaration}" "${generator}")
endfunction()

# The family's Autograd kernels, as its declaration's `autograd:` says: the
# refusing ones are generated (<name>_autograd.cpp), and the `function`s
# live in cpp/ops/autograd/<name>.cpp, which exists exactly when there are some.
function(_fuseops_add_autograd name)
  set(generated "${FUSEOPS_OPS_GENERATED_DIR}/ops_generated")
  set(functions "cpp/ops/autograd/${name}.cpp")
  if(EXISTS "${generated}/autograd/${name}.h")
    if(NOT EXISTS "${PROJECT_SOURCE_DIR}/${functions}")
      message(FATAL_ERROR "fuseops_add_op(${name}): ${functions} is missing: cpp/ops/${name}.yaml "
                          "declares Autograd `function`s (see \"Adding an op\" in CONTRIBUTING.md)")
    endif()
    target_sources(fuseops PRIVATE "${PROJECT_SOURCE_DIR}/${functions}")
  elseif(EXISTS "${PROJECT_SOURCE_DIR}/${functions}")
    message(FATAL_ERROR "fuseops_add_op(${name}): cpp/ops/${name}.yaml declares no Autograd "
                        "`function`, so ${functions} would register nothing")
  endif()
  if(EXISTS "${generated}/${name}_autograd.cpp")
    target_sources(fuseops PRIVATE "${generated}/${name}_autograd.cpp")
  endif()
endfunction()

function(fuseops_add_op name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "COMPOSITE" "" "KERNELS")
  if(ARG_COMPOSITE AND ARG_KERNELS)
    message(FATAL_ERROR "fuseops_add_op(${name}): a COMPOSITE family has no KERNELS")
  endif()
  if(NOT ARG_KERNELS AND NOT ARG_COMPOSITE)
    set(ARG_KERNELS ${name}_kernel)
  endif()
  set(files
    cpp/include/fuseops/${name}.h
    cpp/ops/${name}.yaml
    cpp/ops/${name}.cpp
    python/csrc/${name}.cpp
    tests_cpp/${name}_test.cpp)
  if(NOT ARG_COMPOSITE)
    list(APPEND files
      cpp/ops/${name}.h
      cuda/${name}_kernel.cu)
  endif()
  foreach(kernel IN LISTS ARG_KERNELS)
    list(APPEND files cpp/ops/cpu/${kernel}.cpp)
  endforeach()
  foreach(file IN LISTS files)
    if(NOT EXISTS "${PROJECT_SOURCE_DIR}/${file}")
      message(FATAL_ERROR "fuseops_add_op(${name}): ${file} is missing "
                          "(see \"Adding an op\" in CONTRIBUTING.md)")
    endif()
  endforeach()
  _fuseops_generate_registrations(${name})
  target_sources(fuseops PRIVATE
    "${PROJECT_SOURCE_DIR}/cpp/ops/${name}.cpp"
    "${FUSEOPS_OPS_GENERATED_DIR}/ops_generated/${name}_schemas.cpp")
  if(NOT ARG_COMPOSITE)
    # A family with kernels declares them (`kernels:`), and so gets its Meta
    # and CPU registrations generated: no op writes a registration file.
    set(generated "${FUSEOPS_OPS_GENERATED_DIR}/ops_generated")
    if(NOT EXISTS "${generated}/${name}_meta.cpp")
      message(FATAL_ERROR "fuseops_add_op(${name}): cpp/ops/${name}.yaml declares no "
                          "`kernels:` (a family without kernels is COMPOSITE)")
    endif()
    target_sources(fuseops PRIVATE
      "${generated}/${name}_meta.cpp"
      "${generated}/${name}_cpu.cpp")
  endif()
  _fuseops_add_autograd(${name})
  foreach(kernel IN LISTS ARG_KERNELS)
    fuseops_add_cpu_kernel(fuseops "${PROJECT_SOURCE_DIR}/cpp/ops/cpu/${kernel}.cpp")
  endforeach()
  if(FUSEOPS_WITH_CUDA AND NOT ARG_COMPOSITE)
    target_sources(fuseops PRIVATE
      "${PROJECT_SOURCE_DIR}/cuda/${name}_kernel.cu"
      "${FUSEOPS_OPS_GENERATED_DIR}/ops_generated/${name}_cuda.cpp")
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
