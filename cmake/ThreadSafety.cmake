# STRIDER_THREAD_SAFETY=ON makes a check tree: clang compiles the libraries with its
# thread-safety analysis as errors, so an access to a GUARDED_BY member without its mutex, or a
# call to a REQUIRES function without the lock, stops the build (common/thread_annotations.h).
# scripts/thread_safety.sh configures and builds it against the CUDA LibTorch 2.11 (targets
# strider_libraries and strider_unit_tests) and runs the unit tests there; the default gcc tree
# compiles the same annotations as no-ops. It builds without optimisation or debug info: the
# tree exists to compile, and its unit tests spend their time in LibTorch's own optimised code.
option(STRIDER_THREAD_SAFETY
  "Check locking with clang's -Wthread-safety, as errors (a check tree)" OFF)
if(STRIDER_THREAD_SAFETY)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "STRIDER_THREAD_SAFETY needs clang: configure with CC=clang CXX=clang++")
  endif()
  # C++ only: nvcc compiles this tree's .cu files and knows none of these flags.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety;-Werror=thread-safety;-O0;-g0>")
  message(STATUS "Strider: thread-safety analysis as errors (a check tree)")
  # LibTorch's target exists only after find_package(Torch), further down.
  cmake_language(DEFER CALL strider_thread_safety_torch_headers)
endif()

# LibTorch 1.13's headers reach ATen/core/List.h, whose ListImpl holds a std::vector of the
# still incomplete c10::IValue, before ATen/core/ivalue.h defines it. In C++20 libstdc++'s
# vector is constexpr, and clang instantiates its destructor right there (gcc waits), so under
# clang every LibTorch source fails to compile. Including ivalue.h first, where IValue is
# complete by the time List.h needs it, fixes the order; only code that links LibTorch gets it.
function(strider_thread_safety_torch_headers)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_OPTIONS
    "$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include ATen/core/ivalue.h>")
endfunction()

# strider_libraries: every library target of the build, without tests, benchmarks or the
# binary; what the thread-safety tree builds. Call once, after the last add_subdirectory.
function(strider_add_libraries_target)
  set(libraries)
  set(directories ${PROJECT_SOURCE_DIR})
  while(directories)
    list(POP_FRONT directories directory)
    get_property(children DIRECTORY ${directory} PROPERTY SUBDIRECTORIES)
    list(APPEND directories ${children})
    if(directory MATCHES "^${PROJECT_SOURCE_DIR}/(tests|bench)(/|$)")
      continue()
    endif()
    get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target ${targets})
      get_target_property(type ${target} TYPE)
      if(type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
        list(APPEND libraries ${target})
      endif()
    endforeach()
  endwhile()
  add_custom_target(strider_libraries)
  if(libraries)
    add_dependencies(strider_libraries ${libraries})
  endif()
endfunction()
