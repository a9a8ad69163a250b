# Run by ctest (thread_safety_compile_test): compiles thread_safety_cases.cc with clang's
# thread-safety analysis as errors, once per case. The locked case must compile; each unlocked
# case must fail, and with its own diagnostic, so a failure for any other reason (a missing
# header, an attribute the compiler dropped) fails this test instead of passing it.
#   cmake -DCOMPILER=clang++ -DSOURCE_DIR=<repository> -P thread_safety_check.cmake
if(NOT COMPILER)
  # Matched by the test's SKIP_REGULAR_EXPRESSION: ctest reports it as skipped, not passed.
  message("thread-safety compile test skipped: no clang++ to compile with")
  return()
endif()

set(source ${SOURCE_DIR}/tests/common/thread_safety_cases.cc)
set(flags -std=c++20 -fsyntax-only -Wthread-safety -Werror=thread-safety -I${SOURCE_DIR})

# Each case: its macro, then after "|" the diagnostic it must produce (none: it must compile).
set(cases
  "LOCKED|"
  "UNLOCKED_READ|reading variable 'value_' requires holding mutex 'mu_'"
  "UNLOCKED_WRITE|writing variable 'value_' requires holding mutex 'mu_' exclusively"
  "MISSING_REQUIRES|calling function 'AddLocked' requires holding mutex 'mu_' exclusively"
  "SHARED_WRITE|writing variable 'store_' requires holding mutex 'store_mu_' exclusively"
  "WAIT_UNLOCKED|calling function 'Wait' requires holding mutex 'mu_' exclusively")

set(failures 0)
foreach(entry IN LISTS cases)
  string(FIND "${entry}" "|" bar)
  string(SUBSTRING "${entry}" 0 ${bar} name)
  math(EXPR rest "${bar} + 1")
  string(SUBSTRING "${entry}" ${rest} -1 expected)
  execute_process(
    COMMAND ${COMPILER} ${flags} -DSTRIDER_CASE_${name} ${source}
    RESULT_VARIABLE result
    OUTPUT_VARIABLE output
    ERROR_VARIABLE output)
  if(expected STREQUAL "")
    if(result EQUAL 0)
      message("ok: ${name} compiles")
    else()
      message("FAIL: ${name} must compile under -Werror=thread-safety:\n${output}")
      math(EXPR failures "${failures} + 1")
    endif()
  else()
    string(FIND "${output}" "${expected}" at)
    string(FIND "${output}" "-Wthread-safety" flag_at)
    if(NOT result EQUAL 0 AND at GREATER -1 AND flag_at GREATER -1)
      message("ok: ${name} is refused: ${expected}")
    else()
      message("FAIL: ${name} must fail to compile with \"${expected}\" [-Wthread-safety...]; "
              "exit ${result}:\n${output}")
      math(EXPR failures "${failures} + 1")
    endif()
  endif()
endforeach()
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} thread-safety case(s) did not behave as expected")
endif()
