# What fuseops asks of the C++ compiler, and the sanitizer build.
#
#   fuseops_require_cxx20()           after CMAKE_CXX_STANDARD is set to 20
#   fuseops_enable_sanitizers()       before the first target
#
# FUSEOPS_SANITIZE (cache): sanitizers for fuseops' own code and its gtest
# programs, spelt as for -fsanitize= (e.g. "address,undefined"); empty: none.

include(CheckCXXSourceCompiles)

# torch's headers refuse anything older than C++20, deep inside the first
# file that includes them. Checked here instead, in a fraction of a second,
# with a message that says what to do. The probe uses C++20 library headers
# and concepts, not only the -std flag: a compiler that accepts -std=c++20
# (or -std=c++2a) but implements little of it fails too.
function(fuseops_require_cxx20)
  set(_fuseops_cxx20_ok FALSE)
  if("cxx_std_20" IN_LIST CMAKE_CXX_COMPILE_FEATURES)
    check_cxx_source_compiles([=[
#if __cplusplus < 202002L
#error "not C++20"
#endif
#include <bit>
#include <concepts>
#include <span>
template <std::integral T>
constexpr T twice(T x) { return x + x; }
int main() {
  int values[2] = {1, 2};
  std::span<int> view(values);
  return twice(view[1]) == 4 && std::has_single_bit(4u) ? 0 : 1;
}
]=] FUSEOPS_COMPILER_HAS_CXX20)
    set(_fuseops_cxx20_ok ${FUSEOPS_COMPILER_HAS_CXX20})
  endif()
  if(NOT _fuseops_cxx20_ok)
    message(FATAL_ERROR
      "fuseops needs a C++20 compiler (torch's headers require C++20), but "
      "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} (${CMAKE_CXX_COMPILER}) "
      "does not compile C++20. Use one that does (g++ 12, Debian 12's g++, is tested) and "
      "configure a new build folder with it: CXX=g++-12 cmake ... or "
      "-DCMAKE_CXX_COMPILER=<path>.")
  endif()
endfunction()

set(FUSEOPS_SANITIZE "" CACHE STRING
    "Sanitizers for fuseops and its gtests, as for -fsanitize= (e.g. address,undefined); empty: none")

# Instruments everything this project compiles (the library, its CPU
# capability objects, the gtest programs). LibTorch stays uninstrumented:
# ASan still sees every heap block, because its runtime replaces malloc for
# the whole process, but not torch's own reads and writes. A gtest program
# is instrumented and linked with -fsanitize, so the ASan runtime is loaded
# first, as it must be; a Python process is not (the module fuseops._C would
# need LD_PRELOAD of libasan), which is why only the gtests run sanitized
# (tools/sanitize.sh).
function(fuseops_enable_sanitizers)
  if(FUSEOPS_SANITIZE STREQUAL "")
    return()
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$")
    message(FATAL_ERROR "fuseops: FUSEOPS_SANITIZE needs GCC or Clang, not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  string(REPLACE ";" "," _fuseops_sanitizers "${FUSEOPS_SANITIZE}")
  # -fno-sanitize-recover: undefined behaviour ends the program (and fails
  # the test) instead of printing a line that a passing test would hide.
  # -fno-omit-frame-pointer: ASan's fast unwinder needs frame pointers for
  # readable allocation and free stacks.
  add_compile_options(-fsanitize=${_fuseops_sanitizers} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${_fuseops_sanitizers})
  message(STATUS "fuseops: sanitizers ${_fuseops_sanitizers}")
endfunction()

# libfuseops.so must share torch's C++ runtime (libstdc++.so.6). A compiler
# that links libstdc++ statically (a toolchain built without the shared
# library, or -static-libstdc++ in the flags) gives it a second copy: the
# build succeeds and most ops work, but std::ostream objects then cross the
# two copies and every error message (c10::Error's text) crashes the process.
# tests_py/test_build.py checks the built library's DT_NEEDED entries; this
# says it at configure time, with the fix.
# With CUDA, the CUDA host compiler (CUDAHOSTCXX) matters as much: CMake puts
# its library folders on libfuseops.so's link line, and one that holds only
# libstdc++.a gives the same static copy however good the C++ compiler is.
function(fuseops_check_shared_cxx_runtime compiler role)
  execute_process(COMMAND ${compiler} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE _fuseops_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _fuseops_print_result)
  set(_fuseops_flags "${CMAKE_SHARED_LINKER_FLAGS} ${CMAKE_CXX_FLAGS} $ENV{LDFLAGS}")
  if(NOT _fuseops_print_result EQUAL 0 OR NOT IS_ABSOLUTE "${_fuseops_libstdcxx}"
     OR _fuseops_flags MATCHES "-static-libstdc\\+\\+")
    message(WARNING
      "fuseops: ${compiler} (the ${role}) would link libstdc++ statically into libfuseops.so "
      "(it finds no shared libstdc++.so, or -static-libstdc++ is in the flags). torch uses "
      "the shared libstdc++.so.6, and two copies of the C++ runtime in one process crash on "
      "the first error message. Use a compiler with a shared libstdc++ (e.g. the "
      "distribution's g++: CXX=/usr/bin/g++, and CUDAHOSTCXX=/usr/bin/g++ with CUDA) in a "
      "new build folder.")
  endif()
endfunction()
