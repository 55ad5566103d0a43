# Every dependency is a Debian 12 package installed by tools/setup.sh.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(absl REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC REQUIRED)
find_package(prometheus-cpp REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(spdlog REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(LZ4 REQUIRED IMPORTED_TARGET liblz4)
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
pkg_check_modules(TURBOJPEG REQUIRED IMPORTED_TARGET libturbojpeg)
pkg_check_modules(LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
# A text stream's tokenizer (sample/tokenizer.h): SentencePiece, Debian's libsentencepiece-dev.
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# FFmpeg's nv-codec-headers (Debian: libffmpeg-nvenc-dev): NVCUVID's declarations and a loader
# that opens the driver's libnvcuvid.so.1 at run time (media/nvdec_decoder.h). Headers only.
pkg_check_modules(FFNVCODEC IMPORTED_TARGET ffnvcodec)
find_package(yaml-cpp REQUIRED)
pkg_check_modules(FFMPEG REQUIRED IMPORTED_TARGET
  libavcodec libavformat libavutil libswscale libswresample)
if(CONVEYOR_BUILD_TOOLS)
  find_package(CLI11 REQUIRED)
endif()

# CUDA stays optional: AUTO enables it when the toolkit is found (/usr/local/cuda on our machines).
set(CONVEYOR_HAVE_CUDA OFF)
if(NOT CONVEYOR_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # .cu files are host code around the runtime API, in C++17: CMake 3.25 knows no C++20 flag for
    # nvcc and would otherwise ask for the C++ standard (20) there too.
    set(CMAKE_CUDA_STANDARD 17)
    # One runtime per process: the shared libcudart that CUDA::cudart names, not a second, static
    # copy that CMake would add for every target linking .cu objects.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CONVEYOR_HAVE_CUDA ON)
  elseif(CONVEYOR_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CONVEYOR_CUDA=ON but no CUDA compiler was found (looked in /usr/local/cuda)")
  endif()
endif()
message(STATUS "Conveyor: CUDA ${CONVEYOR_HAVE_CUDA}")
