// base/block_pool.h: reuse by kind and size, the bounds, and freeing what is not kept.
#include "base/block_pool.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

namespace conveyor {
namespace {

std::set<uint8_t*>* freed = nullptr;
void RecordFree(uint8_t* p, int) {
  freed->insert(p);
  std::free(p);
}

BlockPool::Block New(size_t bytes, int kind = 0) {
  return BlockPool::Block{static_cast<uint8_t*>(std::malloc(bytes)), bytes, kind};
}

class BlockPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { freed = &freed_; }
  void TearDown() override { freed = nullptr; }
  std::set<uint8_t*> freed_;
};

TEST_F(BlockPoolTest, ReusesTheSmallestFittingBlockOfTheSameKind) {
  BlockPool pool(8, 1 << 30, 0, RecordFree);
  const BlockPool::Block big = New(4000), small = New(1500), pinned = New(1200, 1);
  pool.Give(big);
  pool.Give(small);
  pool.Give(pinned);
  EXPECT_EQ(pool.blocks(), 3u);
  // 1200 bytes of kind 0: 1500 fits (at most 2 * 1200 + 4096), the pinned block is another kind.
  BlockPool::Block b = pool.Take(1200, 0);
  EXPECT_EQ(b.data, small.data);
  // Nothing of kind 0 between 5000 and 14096 bytes.
  EXPECT_EQ(pool.Take(5000, 0).data, nullptr);
  EXPECT_EQ(pool.Take(1000, 1).data, pinned.data);
  EXPECT_EQ(pool.bytes(), 4000u);
  std::free(b.data);
  std::free(pinned.data);
  EXPECT_TRUE(freed_.empty());
}

TEST_F(BlockPoolTest, BoundsInBlocksBytesAndSizeFreeWhatIsNotKept) {
  BlockPool pool(2, 10000, 100, RecordFree);
  const BlockPool::Block tiny = New(50), a = New(4000), b = New(4000), c = New(1000), d = New(3000);
  pool.Give(tiny);  // under min_bytes
  pool.Give(a);
  pool.Give(b);
  pool.Give(c);  // a third block
  EXPECT_EQ(freed_, (std::set<uint8_t*>{tiny.data, c.data}));
  EXPECT_EQ(pool.bytes(), 8000u);
  BlockPool::Block taken = pool.Take(4000, 0);
  pool.Give(d);  // 4000 + 3000 fits 10000
  EXPECT_EQ(pool.bytes(), 7000u);
  pool.SetMaxBytes(3500);  // frees the newest kept blocks until under the bound
  EXPECT_LE(pool.bytes(), 3500u);
  EXPECT_EQ(pool.blocks(), 0u);
  std::free(taken.data);
}

TEST_F(BlockPoolTest, TheDestructorFreesWhatItKeeps) {
  const BlockPool::Block a = New(1000), b = New(2000);
  {
    BlockPool pool(8, 1 << 30, 0, RecordFree);
    pool.Give(a);
    pool.Give(b);
  }
  EXPECT_EQ(freed_, (std::set<uint8_t*>{a.data, b.data}));
}

}  // namespace
}  // namespace conveyor
