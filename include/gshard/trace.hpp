#pragma once
// Observability: tensor.hpp plus Trace (a timeline of ops, kernels and collectives merged across
// ranks into a Chrome trace), StepPlan and explain_step; the FLOP and memory counters.
#include "kernels/flops.hpp"
#include "kernels/memory.hpp"
#include "tensor.hpp"
#include "trace/timeline.hpp"
