# STRIDER_THREAD_SAFETY=ON makes a check tree: clang compiles the libraries with its
# thread-safety analysis as errors, so an access to a GUARDED_BY member without its mutex, or a
# call to a REQUIRES function without the lock, stops the build (common/thread_annotations.h).
# scripts/thread_safety.sh configures and builds it (target strider_libraries); the default
# gcc tree compiles the same annotations as no-ops.
#
# libstdc++ 12's std::vector is constexpr in C++20, and clang instantiates its destructor where
# LibTorch 1.13's headers hold a vector of the still incomplete c10::IValue (ATen/core/List.h),
# which gcc accepts and clang does not. libc++ 14's vector is not constexpr yet, so this tree
# compiles against libc++. Its objects then cannot be linked with the system's LibTorch,
# RocksDB or ZeroMQ, built against libstdc++: the tree compiles the libraries, links nothing
# and runs nothing, and builds without optimisation or debug info, which only cost time here.
# What of C++20 libc++ 14 lacks and the code uses is in cmake/libcxx_compat.h, included first.
option(STRIDER_THREAD_SAFETY "Check locking with clang's -Wthread-safety, as errors (libraries only)" OFF)
if(STRIDER_THREAD_SAFETY)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "STRIDER_THREAD_SAFETY needs clang: configure with CC=clang CXX=clang++")
  endif()
  add_compile_options(-Wthread-safety -Werror=thread-safety -O0 -g0
    "$<$<COMPILE_LANGUAGE:CXX>:-stdlib=libc++;-include;${PROJECT_SOURCE_DIR}/cmake/libcxx_compat.h>")
  add_link_options($<$<LINK_LANGUAGE:CXX>:-stdlib=libc++>)
  message(STATUS "Strider: thread-safety analysis as errors (a check tree: libraries only)")
endif()

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
