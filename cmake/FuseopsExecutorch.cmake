# Where the Python interpreter's executorch package is, for cpp/executorch.
# Sets `out` to its directory, or to "" when FUSEOPS_EXECUTORCH is OFF, or
# AUTO and the package (or its CMake package) is missing; ON without them
# is an error.
function(fuseops_find_executorch_package out)
  set(${out} "" PARENT_SCOPE)
  if(FUSEOPS_EXECUTORCH STREQUAL "OFF")
    return()
  endif()
  # find_spec, not import: importing executorch imports torch and takes seconds.
  # The package has no __init__.py (a namespace package): its directory is
  # its search location, not its origin.
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util; s = importlib.util.find_spec('executorch'); print(next(iter(s.submodule_search_locations), '') if s and s.submodule_search_locations else '')"
    OUTPUT_VARIABLE _package_dir OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _result)
  if(_result EQUAL 0 AND _package_dir AND EXISTS "${_package_dir}/share/cmake/executorch-config.cmake")
    message(STATUS "fuseops: ExecuTorch kernels against ${_package_dir}")
    set(${out} "${_package_dir}" PARENT_SCOPE)
  elseif(FUSEOPS_EXECUTORCH STREQUAL "ON")
    message(FATAL_ERROR "FUSEOPS_EXECUTORCH=ON, but ${Python_EXECUTABLE} has no executorch "
      "package with its CMake files (pip install 'fuseops[executorch]')")
  else()
    message(STATUS "fuseops: no executorch package; ExecuTorch kernels not built")
  endif()
endfunction()
