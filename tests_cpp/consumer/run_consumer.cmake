# ctest driver: builds and runs the consumer project the way a LibTorch user
# would, with find_package(fuseops) pointed at
#   MODE=build-tree  the fuseops build directory itself;
#   MODE=install     a `cmake --install` of it in WORK_DIR/prefix. A wheel
#                    build (WHEEL_LAYOUT=ON) installs into a folder laid out
#                    like site-packages, torch beside fuseops, as pip puts them.
# The program runs without LD_LIBRARY_PATH, and the loader must resolve every
# library, libgomp.so.1 to torch's own copy (TORCH_LIB_DIR): a second OpenMP
# runtime from the system would be the one torch's kernels use too.
file(REMOVE_RECURSE "${WORK_DIR}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

if(MODE STREQUAL "build-tree")
  set(find_args "-Dfuseops_DIR=${FUSEOPS_BUILD_DIR}")
elseif(MODE STREQUAL "install")
  set(prefix "${WORK_DIR}/prefix")
  run(${CMAKE_COMMAND} --install "${FUSEOPS_BUILD_DIR}" --prefix "${prefix}")
  if(WHEEL_LAYOUT)
    get_filename_component(torch_package "${TORCH_LIB_DIR}" DIRECTORY)
    file(CREATE_LINK "${torch_package}" "${prefix}/torch" SYMBOLIC)
  endif()
  # Only fuseops' prefix is given: its config must find Torch by itself.
  set(find_args "-DCMAKE_PREFIX_PATH=${prefix}")
else()
  message(FATAL_ERROR "MODE must be build-tree or install, got '${MODE}'")
endif()

run(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release ${find_args})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
set(program "${WORK_DIR}/build/fuseops_consumer")

execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ldd "${program}"
  OUTPUT_VARIABLE ldd_out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR ldd_out MATCHES "not found")
  message(FATAL_ERROR "the loader does not resolve every library of ${program}:\n${ldd_out}")
endif()
if(NOT ldd_out MATCHES "libgomp\\.so\\.1 => ([^ ]+)")
  message(FATAL_ERROR "${program} does not load libgomp.so.1:\n${ldd_out}")
endif()
file(REAL_PATH "${CMAKE_MATCH_1}" loaded_gomp)
file(REAL_PATH "${TORCH_LIB_DIR}/libgomp.so.1" torch_gomp)
if(NOT loaded_gomp STREQUAL torch_gomp)
  message(FATAL_ERROR "${program} loads ${loaded_gomp}, not torch's ${torch_gomp}:\n${ldd_out}")
endif()

run(${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH "${program}")
