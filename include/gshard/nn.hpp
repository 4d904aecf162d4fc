#pragma once
// Models and training: autodiff.hpp plus optimizers, schedules, clipping, the MoE layer and the
// Transformer LM (namespace gshard::nn).
#include "autodiff.hpp"
#include "nn/attention.hpp"
#include "nn/clip.hpp"
#include "nn/moe.hpp"
#include "nn/optimizers.hpp"
#include "nn/schedules.hpp"
#include "nn/transformer.hpp"
