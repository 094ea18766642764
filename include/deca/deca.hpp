// Umbrella header: everything a C++ caller of deca needs.
#pragma once

#include "deca/checked.hpp"
#include "deca/error.hpp"
#include "deca/gqa.hpp"
#include "deca/mla.hpp"
#include "deca/quant.hpp"
#include "deca/tensor.hpp"
#include "deca/version.hpp"
