// --shape: a GQA case from a compact description of the caller's own model, next to the presets.
#pragma once

#include <string>

#include "presets.hpp"

namespace deca::bench {

// What --help shows for --shape.
extern const char* const kShapeHelp;

// Parses `b=64,s=4096,hq=64,hkv=8,d=128,p=32,kv=fp8,q=1` (s may be a length distribution
// `uniform:LO:HI`, drawn with a fixed seed). Throws deca::Error naming the key that is wrong.
BenchCase parse_shape(const std::string& spec);

}  // namespace deca::bench
