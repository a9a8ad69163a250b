# strider_add_test(NAME name SOURCES a.cc ... LIBS lib ... LABELS unit|integration|slow [TIMEOUT s])
#
# One ctest entry per test binary, not per test case: binaries linked with LibTorch take about
# 0.4 s to start, so per-case discovery would spend minutes loading shared libraries.
# ctest runs two binaries at once on two cores; OpenMP threads that spin while they wait then
# burn the other binary's core (more than half of all cycles in profiles), so tests wait passively.
set(STRIDER_TEST_ENVIRONMENT
  "STRIDER_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
  "STRIDER_BINARY_DIR=${PROJECT_BINARY_DIR}"
  "OMP_NUM_THREADS=2"
  "OMP_WAIT_POLICY=PASSIVE")

function(strider_add_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME} --gtest_color=no)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  # The thread-safety tree compiles at -O0 (cmake/ThreadSafety.cmake), where the project's own
  # loops run several times slower than in the optimised trees its timeouts were set for.
  if(STRIDER_THREAD_SAFETY)
    math(EXPR ARG_TIMEOUT "${ARG_TIMEOUT} * 4")
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES
    LABELS "${ARG_LABELS}"
    TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "${STRIDER_TEST_ENVIRONMENT}")
  if("unit" IN_LIST ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY STRIDER_UNIT_TESTS ${ARG_NAME})
  endif()
endfunction()

# strider_unit_tests: every binary labelled unit (and what those need, such as the strider
# binary for the launcher's tests), so a tree can build exactly what `ctest -L unit` runs (the
# CUDA LibTorch tree, scripts/thread_safety.sh). Call once, after the last add_subdirectory.
function(strider_add_unit_tests_target)
  get_property(tests GLOBAL PROPERTY STRIDER_UNIT_TESTS)
  add_custom_target(strider_unit_tests)
  if(tests)
    add_dependencies(strider_unit_tests ${tests})
  endif()
endfunction()

# Gives every target with CUDA sources STRIDER_CUDA_ARCHITECTURES unless it names its own.
# LibTorch 2.x's CMake package turns CMAKE_CUDA_ARCHITECTURES off for the whole project (it
# computes its own flags from TORCH_CUDA_ARCH_LIST, for its own sources only), which would leave
# nvcc's default architecture, not Hopper, on ours. Call once, after the last add_subdirectory.
function(strider_set_cuda_architectures)
  if(NOT CMAKE_CUDA_COMPILER)
    return()
  endif()
  set(directories ${PROJECT_SOURCE_DIR})
  while(directories)
    list(POP_FRONT directories directory)
    get_property(children DIRECTORY ${directory} PROPERTY SUBDIRECTORIES)
    list(APPEND directories ${children})
    get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target ${targets})
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "INTERFACE_LIBRARY" OR type STREQUAL "UTILITY")
        continue()
      endif()
      get_target_property(sources ${target} SOURCES)
      list(FILTER sources INCLUDE REGEX "\\.cu$")
      get_target_property(architectures ${target} CUDA_ARCHITECTURES)
      if(sources AND NOT architectures)
        set_target_properties(${target} PROPERTIES
          CUDA_ARCHITECTURES "${STRIDER_CUDA_ARCHITECTURES}")
      endif()
    endforeach()
  endwhile()
endfunction()

# strider_add_subdirectories(dir ...): add_subdirectory for folders the build requires. A missing
# folder or CMakeLists.txt stops the configuration with its path; a component is never left out
# of the build because a file is missing. A macro, so the folders see the caller's variables.
macro(strider_add_subdirectories)
  foreach(strider_subdirectory ${ARGN})
    if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${strider_subdirectory}/CMakeLists.txt)
      message(FATAL_ERROR "Strider: ${CMAKE_CURRENT_SOURCE_DIR}/${strider_subdirectory}/"
        "CMakeLists.txt is missing: the build needs every component folder")
    endif()
    add_subdirectory(${strider_subdirectory})
  endforeach()
endmacro()
