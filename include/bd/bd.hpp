// bd/bd.hpp — the decomposition: decompose_product / decompose_shared, the Decomposition they
// return, Options, the storage types, the exceptions and the Workspace. The layers built on it
// are included by name (bd/nn/bd_attention.hpp, bd/nn/bd_linear.hpp, …), as are checkpoints
// (bd/io/…) and training (bd/train/…): a program that decomposes a matrix compiles none of them.
//
// Basis Decomposition: a rank-r product W = U·Vᵀ is r of its rows (the basis B) and the
// coefficients C that rebuild the others, W = P·[I; C]·B. Stored that way it costs
// r(m + n − r) numbers and x·W costs r fewer multiply-adds per output than the factors.
#pragma once

#define BD_VERSION_MAJOR 0
#define BD_VERSION_MINOR 1
#define BD_VERSION_PATCH 0

#include "bd/base/error.hpp"
#include "bd/base/workspace.hpp"
#include "bd/core/decompose.hpp"
#include "bd/core/decomposition.hpp"
#include "bd/core/options.hpp"
#include "bd/core/scalar.hpp"
