#pragma once
// Optimizers over sharded parameters: Sgd, Adam, AdamW, Adafactor.
//
//   gshard::nn::Adam opt({.learning_rate = nn::inverse_sqrt(1e-3, 4000)});
//   opt.step(std::tie(w1, w2), std::tie(g1, g2));   // w1, w2 updated in place
//
// Each gradient has its parameter's type (same layout) and global shape. State tensors
// (momentum, Adam's m and v, Adafactor's moments and row/column statistics) are created on the
// first step, sharded like their parameter (Adafactor's factored statistics like the parameter's
// kept labels); a later step with another count of parameters, other types or other shapes is an
// Error. Every rank updates its own block, so copies over replicated axes stay identical; padding
// stays zero. Sgd, Adam and AdamW never communicate. Adafactor's means and RMS values are over
// global values: per factored parameter and step, AllReduces over the axes of the last label
// (row statistics), of the second-to-last label (column statistics, then the mean of the row
// statistics), and one of 2 doubles over all the parameter's axes (RMS of the update and of the
// parameter); unfactored, only the last. Axis sets whose sizes multiply to 1 communicate nothing.
//
// Checkpoints: opt.save(writer, params) adds the state as tensors "optimizer.<i>.<slot>" and the
// step count as metadata "optimizer.steps" (io/safetensors.hpp); opt.load(reader, params) restores
// them onto the parameters' mesh and layouts, whatever mesh saved them.
//
// One header per optimizer under nn/optimizers/, over the shared driver (driver.hpp). Saving and
// loading take io::SafetensorsWriter/Reader: include io/safetensors.hpp to checkpoint.
#include "optimizers/adafactor.hpp"
#include "optimizers/adam.hpp"
#include "optimizers/driver.hpp"
#include "optimizers/sgd.hpp"
