# ctest InstalledPackage.*: installs the build tree BUILD_DIR into a prefix
# under WORK_DIR, then
#   find_package: configures tests/install/consumer (copied out of the source
#     tree, with every runtime/examples/*.cpp and the header they share) against the installed copy
#     only, builds it, and runs each example with no arguments (each verifies
#     its own results and exits 0);
#   pkg_config: builds one example with a plain
#     `c++ -std=c++20 example.cpp $(pkg-config --cflags --libs spindle)` and runs it.
# Inputs: BUILD_DIR SOURCE_DIR WORK_DIR MODE (find_package|pkg_config)
# GENERATOR MAKE_PROGRAM CXX LIBDIR.
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${ARGN}\n${out}\n${err}")
  endif()
endfunction()

run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
if(NOT EXISTS ${prefix}/include/spindle/loader.hpp)
  message(FATAL_ERROR "cmake --install put no spindle/loader.hpp under ${prefix}/include")
endif()
# detail/ is not API: none is installed, so a public header that included one would not compile
# alone below (each_header_alone).
file(GLOB_RECURSE installed_detail RELATIVE ${prefix}/include ${prefix}/include/spindle/detail/*)
if(installed_detail)
  message(FATAL_ERROR "cmake --install put internal headers under ${prefix}/include: ${installed_detail}")
endif()

file(GLOB examples ${SOURCE_DIR}/runtime/examples/*.cpp ${SOURCE_DIR}/runtime/examples/*.hpp)

if(MODE STREQUAL "find_package")
  set(src ${WORK_DIR}/consumer)
  file(COPY ${SOURCE_DIR}/tests/install/consumer/CMakeLists.txt DESTINATION ${src})
  file(COPY ${examples} DESTINATION ${src}/examples)
  # CMAKE_PREFIX_PATH names the installed copy; nothing points into the source tree.
  run("configuring the consumer" ${CMAKE_COMMAND} -S ${src} -B ${WORK_DIR}/consumer-build -G ${GENERATOR}
      -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
  # Proof that the consumer used the installed copy only: no path of the source tree in its build.
  set(from_source -1)
  if(EXISTS ${WORK_DIR}/consumer-build/build.ninja)  # (the Ninja generator, as `make build-cpp` uses)
    file(READ ${WORK_DIR}/consumer-build/build.ninja ninja_text)
    string(FIND "${ninja_text}" "${SOURCE_DIR}/runtime" from_source)
  endif()
  if(NOT from_source EQUAL -1)
    message(FATAL_ERROR "the consumer's build refers to ${SOURCE_DIR}/runtime: it must use the installed copy only")
  endif()
  run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
  file(READ ${WORK_DIR}/consumer-build/examples.txt names)
  foreach(name IN LISTS names)
    message(STATUS "running ${name}")
    run("example ${name}" ${WORK_DIR}/consumer-build/${name})
  endforeach()
elseif(MODE STREQUAL "pkg_config")
  set(example ${SOURCE_DIR}/runtime/examples/native_pipeline.cpp)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
  run("the pkg-config build" sh -c "${CXX} -std=c++20 -O1 -o ${WORK_DIR}/native_pipeline ${example} $(pkg-config --cflags --libs spindle)")
  run("the pkg-config-built native_pipeline" ${WORK_DIR}/native_pipeline)
else()
  message(FATAL_ERROR "MODE must be find_package or pkg_config, not '${MODE}'")
endif()
