# `cmake --install BUILD --prefix P`: the public headers (P/include/trident), the part libraries
# (P/lib/libtrident_<part>.a), the trident binary (P/bin) and the CMake package
# (P/lib/cmake/trident: tridentConfig.cmake, tridentConfigVersion.cmake, tridentTargets.cmake),
# so another project can
#     find_package(trident REQUIRED)                # with -DCMAKE_PREFIX_PATH=P
#     target_link_libraries(app PRIVATE trident::train)
# (examples/own_model/CMakeLists.txt does; tests/cli/test_install_package.sh builds it so).
#
# Note [Installed package]
# The targets are trident::core, backend, io, comm, model, train (and cuda with the CUDA
# backend), linked as in the build. They are static, so everything they link, PRIVATE or not, is
# needed where the application links: tridentConfig.cmake finds each of those packages again
# (find_dependency) before loading the targets. Eigen (header-only, private) and CLI11 (the
# binary's) are not among them; with CUDA it also finds CUDAToolkit, cuDNN and NCCL.
include(CMakePackageConfigHelpers)
set(trident_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/trident)

get_property(trident_installed_targets GLOBAL PROPERTY trident_installed_targets)
install(TARGETS ${trident_installed_targets} EXPORT tridentTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})  # headers: each target's INSTALL_INTERFACE
install(TARGETS trident RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Every public header: cuda_backend.h and nccl_comm.h declare what trident::cuda defines.
install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/trident
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT tridentTargets NAMESPACE trident:: DESTINATION ${trident_cmake_dir})

set(TRIDENT_PACKAGE_CUDA ${TRIDENT_CUDA})
configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/tools/cmake/tridentConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/tridentConfig.cmake
                              INSTALL_DESTINATION ${trident_cmake_dir})
# 0.x: a minor version may change the interface.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tridentConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tridentConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/tridentConfigVersion.cmake
        DESTINATION ${trident_cmake_dir})
if(TRIDENT_CUDA)
  install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/tools/cmake/cuda_libs.cmake
          DESTINATION ${trident_cmake_dir} RENAME trident_cuda_libs.cmake)
endif()
