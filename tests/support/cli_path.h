// The `conveyor` CLI the tests run (force-included into every test, tests/CMakeLists.txt):
// $CONVEYOR_CLI when set (the device bundle points it at its wrapper, docs/device.md), else the
// build tree's binary.
#pragma once

#include <cstdlib>

#define CONVEYOR_CLI                                                               \
  ((::std::getenv("CONVEYOR_CLI") != nullptr && *::std::getenv("CONVEYOR_CLI") != 0) \
       ? ::std::getenv("CONVEYOR_CLI")                                             \
       : CONVEYOR_CLI_BUILT)
