// The one random seed of a test run: DECA_TEST_SEED from the environment (default 1234), so a
// failure can be replayed. DECA_SEED_TRACE() makes every failing assertion of the enclosing
// scope print it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include <gtest/gtest.h>

namespace deca::test {

inline std::uint64_t test_seed() {
  const char* env = std::getenv("DECA_TEST_SEED");
  return env && *env ? std::strtoull(env, nullptr, 10) : 1234u;
}

inline std::string seed_message() {
  return "DECA_TEST_SEED=" + std::to_string(test_seed()) + " (set it to replay)";
}

// A generator per test: the run's seed mixed with a per-test salt, so that tests do not share
// one stream and adding a test does not change the data of the others.
inline std::mt19937_64 make_rng(std::uint64_t salt = 0) {
  return std::mt19937_64(test_seed() * 0x9E3779B97F4A7C15ull + salt);
}

}  // namespace deca::test

#define DECA_SEED_TRACE() SCOPED_TRACE(::deca::test::seed_message())
