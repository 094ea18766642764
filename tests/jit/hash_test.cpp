#include <gtest/gtest.h>

#include "jit/cache_key.hpp"
#include "jit/hash.hpp"
#include "test_kernels.hpp"

namespace deca::jit {
namespace {

TEST(Fnv1a64, KnownVectors) {
  // Published FNV-1a 64-bit test vectors.
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ull);
}

TEST(Fnv1a64, IncrementalEqualsOneShot) {
  EXPECT_EQ(Fnv1a64().bytes("foo", 3).bytes("bar", 3).value(), fnv1a64("foobar", 6));
}

TEST(Fnv1a64, FieldsAreLengthPrefixed) {
  EXPECT_NE(Fnv1a64().field("ab").field("c").value(), Fnv1a64().field("a").field("bc").value());
  EXPECT_NE(Fnv1a64().field(std::int64_t{1}).value(), Fnv1a64().field(std::int64_t{256}).value());
}

TEST(ToHex, SixteenLowercaseDigits) {
  EXPECT_EQ(to_hex(0), "0000000000000000");
  EXPECT_EQ(to_hex(0x85944171f73967e8ull), "85944171f73967e8");
}

TEST(CacheKey, StableForEqualSpecs) {
  const JitSpec a = testing::axpy_spec(90);
  EXPECT_EQ(cache_key(a).hash, cache_key(testing::axpy_spec(90)).hash);
  EXPECT_EQ(cache_key(a).str(), a.name + "-" + to_hex(cache_key(a).hash));
}

TEST(CacheKey, ChangesWithEveryInput) {
  const JitSpec base = testing::axpy_spec(80);
  const std::uint64_t h = cache_key(base).hash;

  JitSpec source = base;
  source.source += "\n// one more line\n";
  EXPECT_NE(cache_key(source).hash, h);

  JitSpec options = base;
  options.extra_options.push_back("-DDECA_SOMETHING=1");
  EXPECT_NE(cache_key(options).hash, h);

  JitSpec arch = base;
  arch.arch = 86;
  EXPECT_NE(cache_key(arch).hash, h);

  JitSpec entry = base;
  entry.entry = "other_entry";
  EXPECT_NE(cache_key(entry).hash, h);

  JitSpec name = base;
  name.name += "_b";
  EXPECT_NE(cache_key(name).hash, h);
}

TEST(CacheKey, IncludesEmbeddedSources) {
  // Not a constant: it hashes at least the params headers that exist.
  EXPECT_NE(embedded_sources_hash(), Fnv1a64().field(std::int64_t{0}).value());
}

}  // namespace
}  // namespace deca::jit
