#pragma once
// Every op family: einsum.hpp plus reductions, normalizations, scans, top-k, index, random,
// shape and windowed ops.
#include "einsum.hpp"
#include "ops/conv.hpp"
#include "ops/index.hpp"
#include "ops/normalize.hpp"
#include "ops/random.hpp"
#include "ops/reduce.hpp"
#include "ops/scan.hpp"
#include "ops/shape.hpp"
#include "ops/topk.hpp"
