# The Debian package: `./run package` (or `cpack --config BUILD/CPackConfig.cmake`) writes
# conveyor_<version>_amd64.deb with what cmake/ConveyorInstall.cmake installs under /usr.
# Dependencies are Debian's packages, none bundled: dpkg-shlibdeps names the libraries the
# binaries load (libgrpc++1.51, libavcodec59, libabsl20220623, ...), and the Python package adds
# python3 and python3-numpy. Building against the client library needs the compiler, CMake and
# absl's headers (Suggests; docs/install.md).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME conveyor)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "Conveyor")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Multimodal data loading for robot-learning and video-model training")
set(CPACK_PACKAGE_DESCRIPTION
    "Conveyor feeds video, audio, proprioception and actions to training jobs: a data server\n\
(conveyor serve) that decodes, shuffles and packs batches and streams them over gRPC, the\n\
conveyor command line, the C++ client library with its CMake package (find_package(Conveyor))\n\
and the Python package (import conveyor).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_SOURCE_IGNORE_FILES "/build/;/out/;/\\\\.git/")
set(CPACK_PACKAGE_CONTACT "Conveyor maintainers <conveyor@localhost>")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # conveyor_<version>_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The package's own libraries get a shlibs file and an ldconfig trigger.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3, python3-numpy")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "g++, cmake, libabsl-dev, python3-torch")
set(CPACK_OUTPUT_FILE_PREFIX ${CMAKE_BINARY_DIR}/package)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/package)
include(CPack)
