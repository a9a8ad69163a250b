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
  set_tests_properties(${ARG_NAME} PROPERTIES
    LABELS "${ARG_LABELS}"
    TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "${STRIDER_TEST_ENVIRONMENT}")
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
