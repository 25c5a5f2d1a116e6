# CPU kernels compiled once per CPU capability, picked at run time.
#
#   fuseops_enable_cpu_kernels(<target>)        once, after add_library
#   fuseops_add_cpu_kernel(<target> <source>)   once per kernel file
#
# Each kernel file is compiled into one OBJECT library per capability with
# -DCPU_CAPABILITY=<CAP> -DCPU_CAPABILITY_<CAP>, so `at::vec::Vectorized`
# (which lives in `inline namespace CPU_CAPABILITY`) gets that capability's
# width, and the file registers its kernels with
# FUSEOPS_REGISTER_CPU_KERNEL (cpp/ops/cpu/dispatch.h).
#
# The DEFAULT objects are linked first on purpose: the variants share weak
# symbols of inline functions that live outside the capability namespace
# (e.g. std::exp(float)), and the linker keeps the first copy it sees. An
# AVX512 copy kept there would crash a CPU without AVX-512.

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(_fuseops_known_capabilities DEFAULT AVX2 AVX512)
else()
  set(_fuseops_known_capabilities DEFAULT)
endif()
# All of them unless told: a build for one machine (the sanitizer build,
# tools/sanitize.sh) may keep DEFAULT and the one that machine runs.
set(FUSEOPS_CPU_CAPABILITIES "${_fuseops_known_capabilities}" CACHE STRING
    "CPU capability builds of the kernels, DEFAULT first (default: all of ${_fuseops_known_capabilities})")
list(GET FUSEOPS_CPU_CAPABILITIES 0 _fuseops_first_capability)
if(NOT _fuseops_first_capability STREQUAL "DEFAULT")
  message(FATAL_ERROR "fuseops: FUSEOPS_CPU_CAPABILITIES must start with DEFAULT "
                      "(the fallback every CPU runs), got \"${FUSEOPS_CPU_CAPABILITIES}\"")
endif()
foreach(_cap IN LISTS FUSEOPS_CPU_CAPABILITIES)
  if(NOT _cap IN_LIST _fuseops_known_capabilities)
    message(FATAL_ERROR "fuseops: FUSEOPS_CPU_CAPABILITIES: unknown capability \"${_cap}\" "
                        "(known here: ${_fuseops_known_capabilities})")
  endif()
endforeach()

set(FUSEOPS_CPU_FLAGS_DEFAULT "")
# -mf16c: at::vec converts float16 with the F16C instructions on AVX2.
set(FUSEOPS_CPU_FLAGS_AVX2
  -mavx2 -mfma -mf16c -mno-avx256-split-unaligned-load -mno-avx256-split-unaligned-store)
set(FUSEOPS_CPU_FLAGS_AVX512
  -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma)
# GCC before 13 warns inside its own avx512fintrin.h, where the
# _mm512_undefined_* helpers spell "undefined" as `__m512 __Y = __Y;`: one
# -Wuninitialized per inlined use (711 in a build; GCC bug 105593). Only the
# AVX512 objects include that code; the same kernel sources are compiled with
# the warning on as DEFAULT and AVX2.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  set(FUSEOPS_CPU_WARNINGS_AVX512 -Wno-uninitialized)
endif()

function(fuseops_enable_cpu_kernels target)
  # at::parallel_for is a header template: with ATen built on OpenMP (every
  # PyTorch release for Linux), it splits the work only in code compiled with
  # OpenMP; elsewhere its `#pragma omp parallel` is ignored and every kernel
  # runs on one thread (measured: silu and swiglu did not speed up at all
  # from 1 to 2 threads while ATen's ops halved).
  # cpp/ops/cpu/dispatch.h refuses to compile a kernel without it.
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  # One runtime, one thread pool: the library links the libgomp.so.1 torch
  # ships (pip wheels keep it in torch/lib) rather than the compiler's, which
  # would also leave two libgomp.so.1 on the runtime search path.
  find_file(_fuseops_torch_libgomp libgomp.so.1
    PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH NO_CACHE)
  if(_fuseops_torch_libgomp)
    target_link_libraries(${target} PRIVATE "${_fuseops_torch_libgomp}")
  else()
    target_link_libraries(${target} PRIVATE OpenMP::OpenMP_CXX)
  endif()
  foreach(cap IN LISTS FUSEOPS_CPU_CAPABILITIES)
    set(objects ${target}_cpu_${cap})
    add_library(${objects} OBJECT)
    set_target_properties(${objects} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_compile_definitions(${objects} PRIVATE
      CPU_CAPABILITY=${cap} CPU_CAPABILITY_${cap})
    # -ffp-contract=off: kernels spell out their FMAs (at::vec::fmadd). If the
    # compiler fused other a*b+c on its own, a scalar tail would round
    # differently from the vector body, and two passes that must agree (a row
    # sum and the values it is subtracted from) would not: layer_norm's input
    # gradient of a one-element row came out 7e-5 instead of 0.
    target_compile_options(${objects} PRIVATE ${FUSEOPS_CPU_FLAGS_${cap}} -ffp-contract=off)
    # Same include directories, definitions and torch usage requirements as
    # the library itself.
    target_include_directories(${objects} PRIVATE
      $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
    target_compile_definitions(${objects} PRIVATE
      $<TARGET_PROPERTY:${target},COMPILE_DEFINITIONS>)
    target_compile_options(${objects} PRIVATE
      $<TARGET_PROPERTY:${target},COMPILE_OPTIONS>
      # at::vec's partial loads (the tail of a row) leave the unused lanes
      # uninitialised by design; GCC flags that inside its intrinsics headers.
      -Wno-maybe-uninitialized
      ${FUSEOPS_CPU_WARNINGS_${cap}})
    target_link_libraries(${objects} PRIVATE torch OpenMP::OpenMP_CXX)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:${objects}>)
    string(TOUPPER "${cap}" cap_upper)
    target_compile_definitions(${target} PRIVATE FUSEOPS_HAVE_CPU_${cap_upper})
  endforeach()
endfunction()

function(fuseops_add_cpu_kernel target source)
  foreach(cap IN LISTS FUSEOPS_CPU_CAPABILITIES)
    target_sources(${target}_cpu_${cap} PRIVATE ${source})
  endforeach()
endfunction()
