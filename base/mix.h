// splitmix64's output function: a cheap, well-mixed bijection on 64-bit integers, fixed by its
// definition (the same bits everywhere). Used to derive keys from (seed, epoch, ...) for the
// epoch order and the augmentation draws.
#pragma once

#include <cstdint>

namespace conveyor {

inline uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace conveyor
