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
