# Cross-compiling for the Jetson Orin CPU (aarch64) with Debian's cross
# toolchain (g++-aarch64-linux-gnu); the binaries run under qemu-aarch64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
# Target libraries (libutf8proc-dev:arm64) from the multiarch directory;
# headers, which do not depend on the architecture, from /usr/include.
set(CMAKE_LIBRARY_PATH /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
