# What `cmake --install` puts where (docs/install.md), and so what the Debian package holds:
#
#   bin/conveyor                              the command line
#   lib/conveyor/libconveyor_sentencepiece.so SentencePiece, loaded by the CLI at run time
#   lib/<multiarch>/libconveyor_client.so.1   the C++ client, shared, with the project's own static
#                                             libraries (base, device, the wire protocol) inside
#   lib/<multiarch>/libconveyor_c.so.1        the C ABI the Python package loads (when built):
#                                             the client only, no FFmpeg, curl, yaml-cpp or CUDA
#   lib/<multiarch>/libconveyor_video.so.1    DeviceFrames' C ABI, loaded by conveyor.video when
#                                             used (the data path: FFmpeg, NVDEC)
#   include/conveyor/{client,base}/*.h        the client's public headers ("client/client.h")
#   lib/<multiarch>/cmake/Conveyor/           find_package(Conveyor): Conveyor::client
#   lib/python3/dist-packages/conveyor/       the Python package (Debian's place for it)
#   share/doc/conveyor/, share/conveyor/      docs, example configs, deploy recipes
#
# Included at the end of the top-level CMakeLists.txt, after every add_subdirectory, so the
# targets it refers to (by name only: conveyor, conveyor_client, conveyor_c, conveyor_video)
# exist or are known not to.
# The fuzz tree (clang, sanitizers, no tools) installs nothing; a shared library there would need
# the sanitizer runtimes that only executables link.
if(CONVEYOR_BUILD_FUZZ)
  return()
endif()

# Debian's multiarch library directory for any prefix, not only /usr (GNUInstallDirs picks it only
# for /usr): /usr/local/lib/x86_64-linux-gnu is on the loader's path too (ld.so.conf.d).
if(CMAKE_LIBRARY_ARCHITECTURE AND NOT DEFINED CMAKE_INSTALL_LIBDIR)
  set(CMAKE_INSTALL_LIBDIR "lib/${CMAKE_LIBRARY_ARCHITECTURE}" CACHE PATH "Object code libraries")
endif()
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# SentencePiece's module (sample/CMakeLists.txt says why it is one): beside the executable, in
# lib/conveyor/, where internal/sentencepiece_model.cc looks for it (../lib/conveyor from bin/).
if(TARGET conveyor_sentencepiece AND TARGET conveyor)
  install(TARGETS conveyor_sentencepiece LIBRARY DESTINATION lib/conveyor COMPONENT conveyor)
endif()

# The shared client. The static conveyor_client stays what the project's own programs and tests
# link; this one is built from the same objects (whole archive: every client object, then what they
# need of conveyor_base, conveyor_device and conveyor_service_proto, all PIC) and links gRPC,
# protobuf and absl dynamically, as Debian ships them. Its public headers name absl only.
if(TARGET conveyor_client)
  set(CONVEYOR_CLIENT_SOVERSION 1)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/conveyor_version.cc.in
                 ${CMAKE_BINARY_DIR}/generated/conveyor_version.cc @ONLY)
  add_library(conveyor_client_shared SHARED ${CMAKE_BINARY_DIR}/generated/conveyor_version.cc)
  target_link_libraries(conveyor_client_shared
    PUBLIC absl::statusor absl::status
    PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,conveyor_client>")
  set_target_properties(conveyor_client_shared PROPERTIES
    OUTPUT_NAME conveyor_client
    VERSION ${PROJECT_VERSION}
    SOVERSION ${CONVEYOR_CLIENT_SOVERSION}
    EXPORT_NAME client
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib
    # A CUDA build links the toolkit's libcudart outside the loader's path: keep that directory
    # in the installed library's RUNPATH. Debian's libraries (all the package build has) add none.
    INSTALL_RPATH_USE_LINK_PATH ON)
  # Undefined symbols are link errors here, not surprises for the trainer that loads it.
  target_link_options(conveyor_client_shared PRIVATE -Wl,--no-undefined)
  target_include_directories(conveyor_client_shared INTERFACE
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/conveyor>)

  install(TARGETS conveyor_client_shared EXPORT ConveyorTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT conveyor NAMELINK_COMPONENT conveyor)
  # The public headers and what they include of the project (base/types.h, base/tensor_desc.h for
  # client::TensorView, and base/coverage.h with base/mix.h for the client's coverage ledger); each
  # compiles on its own with absl (tests/public_headers_test.sh).
  install(FILES ${PROJECT_SOURCE_DIR}/client/client.h ${PROJECT_SOURCE_DIR}/client/launch_env.h
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/conveyor/client COMPONENT conveyor)
  install(FILES ${PROJECT_SOURCE_DIR}/base/types.h ${PROJECT_SOURCE_DIR}/base/tensor_desc.h
    ${PROJECT_SOURCE_DIR}/base/coverage.h ${PROJECT_SOURCE_DIR}/base/mix.h
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/conveyor/base COMPONENT conveyor)

  set(CONVEYOR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Conveyor)
  install(EXPORT ConveyorTargets NAMESPACE Conveyor:: DESTINATION ${CONVEYOR_CMAKE_DIR}
    COMPONENT conveyor)
  configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ConveyorConfig.cmake.in
    ${CMAKE_BINARY_DIR}/generated/ConveyorConfig.cmake INSTALL_DESTINATION ${CONVEYOR_CMAKE_DIR})
  # Same major version: 0.x releases may change the API, so 0.x asks for the same minor too.
  write_basic_package_version_file(${CMAKE_BINARY_DIR}/generated/ConveyorConfigVersion.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_BINARY_DIR}/generated/ConveyorConfig.cmake
                ${CMAKE_BINARY_DIR}/generated/ConveyorConfigVersion.cmake
    DESTINATION ${CONVEYOR_CMAKE_DIR} COMPONENT conveyor)
endif()

if(TARGET conveyor)
  install(TARGETS conveyor RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT conveyor)
endif()

# The C ABI (capi/): the libraries the pure-Python package loads with ctypes (libconveyor_video
# only when conveyor.video is used), and their headers.
if(TARGET conveyor_c)
  install(TARGETS conveyor_c conveyor_video
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT conveyor NAMELINK_COMPONENT conveyor)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/capi/include/conveyor/
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/conveyor COMPONENT conveyor FILES_MATCHING PATTERN "*.h")
endif()

# The Python package, where Debian's python3 looks (no version in the path: pure Python over
# libconveyor_c.so.1, docs/python.md). It finds the libraries through the dynamic loader's path,
# so they are not copied here.
set(CONVEYOR_PYTHON_INSTALL_DIR lib/python3/dist-packages/conveyor CACHE STRING
    "Where the Python package is installed, relative to the prefix")
# __version__ comes from project(VERSION) like `conveyor --version`: _version.py is written here and
# beside the package in the build tree (build/python/conveyor/, what PYTHONPATH=build/python finds).
configure_file(${CMAKE_CURRENT_LIST_DIR}/_version.py.in
               ${CMAKE_BINARY_DIR}/python/conveyor/_version.py @ONLY)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/conveyor/ DESTINATION ${CONVEYOR_PYTHON_INSTALL_DIR}
  COMPONENT conveyor FILES_MATCHING PATTERN "*.py" PATTERN "py.typed" PATTERN "__pycache__" EXCLUDE)
install(FILES ${CMAKE_BINARY_DIR}/python/conveyor/_version.py
  DESTINATION ${CONVEYOR_PYTHON_INSTALL_DIR} COMPONENT conveyor)

# Docs, example configs and the deploy recipes: what docs/install.md points an installed user at.
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/CHANGELOG.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT conveyor)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
  COMPONENT conveyor)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DATADIR}/conveyor/examples
  COMPONENT conveyor)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/examples/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/conveyor/examples/python COMPONENT conveyor)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/deploy/ DESTINATION ${CMAKE_INSTALL_DATADIR}/conveyor/deploy
  COMPONENT conveyor USE_SOURCE_PERMISSIONS)
