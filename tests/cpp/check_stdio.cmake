# Runs PROBE MODE with stdout redirected to a file (fully buffered, as a job's
# log is) and fails unless the line the probe printed before starting its
# loader, and the one before it started a zygote, each appear exactly once.
set(out "${CMAKE_CURRENT_BINARY_DIR}/stdio_probe_${MODE}.txt")
execute_process(COMMAND "${PROBE}" "${MODE}" OUTPUT_FILE "${out}" RESULT_VARIABLE rc)
file(READ "${out}" text)
foreach(line "a line printed before the zygote starts" "a line printed before the loader starts")
  file(STRINGS "${out}" lines REGEX "^${line}$")
  list(LENGTH lines count)
  if(NOT rc EQUAL 0 OR NOT count EQUAL 1)
    message(FATAL_ERROR "stdio_probe ${MODE}: exit ${rc}; '${line}' appears ${count} times (expected once). "
                        "Output:\n${text}")
  endif()
endforeach()
