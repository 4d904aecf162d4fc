#pragma once
// Training without the nn layer: ops.hpp plus track, grad, checkpoint and NoGrad.
#include "autodiff/checkpoint.hpp"
#include "autodiff/grad.hpp"
#include "ops.hpp"
