#pragma once

namespace deca {
const char* version();
}  // namespace deca
