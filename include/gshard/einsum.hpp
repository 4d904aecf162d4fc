#pragma once
// A program of meshes, sharded tensors, einsums and elementwise math: tensor.hpp plus the lazy
// einsum and elementwise expressions, strict mode and explain(expr).
#include "expr/explain.hpp"
#include "ops/einsum.hpp"
#include "ops/elementwise.hpp"
#include "tensor.hpp"
