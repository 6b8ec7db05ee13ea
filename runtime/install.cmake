# `cmake --install <build>`: the static library (libspindle.a), its public
# headers, a CMake package (find_package(spindle CONFIG REQUIRED), target
# spindle::spindle) and spindle.pc for pkg-config. docs/cpp.md shows both uses;
# tests/install builds every example against an installed copy.
include(CMakePackageConfigHelpers)

install(TARGETS spindle_core EXPORT spindleTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# Public headers; detail/ is not API and stays out: no public header includes
# one (worker_context.hpp only declares the ring it views).
install(DIRECTORY include/spindle DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp" PATTERN "detail" EXCLUDE)

set(_spindle_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/spindle)
install(EXPORT spindleTargets NAMESPACE spindle:: DESTINATION ${_spindle_cmake_dir})

# The decoders, found again for the consumer from the same list this build used.
set(SPINDLE_FIND_DECODERS "")
set(_spindle_pc_requires "tbb")
foreach(_pair IN LISTS SPINDLE_DECODER_MODULES)
  separate_arguments(_pair)
  list(GET _pair 0 _prefix)
  list(GET _pair 1 _module)
  string(APPEND SPINDLE_FIND_DECODERS "spindle_find_decoder(${_prefix} ${_module})\n")
  string(APPEND _spindle_pc_requires " ${_module}")
endforeach()
configure_package_config_file(cmake/spindleConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/spindleConfig.cmake
  INSTALL_DESTINATION ${_spindle_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/spindleConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/spindleConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/spindleConfigVersion.cmake
  DESTINATION ${_spindle_cmake_dir})

# spindle.pc: the library is static, so its dependencies are in Requires (not
# Requires.private), and `pkg-config --libs spindle` alone links a program. The
# prefix is relative to the .pc file, so an installed tree can be moved.
set(SPINDLE_PC_REQUIRES "${_spindle_pc_requires}")
file(RELATIVE_PATH SPINDLE_PC_PREFIX_FROM_PCFILEDIR "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" SPINDLE_PC_PREFIX_FROM_PCFILEDIR "${SPINDLE_PC_PREFIX_FROM_PCFILEDIR}")
configure_file(cmake/spindle.pc.in ${CMAKE_CURRENT_BINARY_DIR}/spindle.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/spindle.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
