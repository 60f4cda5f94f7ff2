# Cross-compiling the C++ runtime for 64-bit Arm Linux (Raspberry Pi 5, Jetson Orin's CPU, Graviton)
# with Debian's g++-aarch64-linux-gnu: cpp/scripts/build.sh aarch64 uses it (docs/cpp.md,
# "Cross-building for a board").
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# the target's libraries and headers only; programs (python, the generator) are the host's
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
