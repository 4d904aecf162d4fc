#pragma once
// Tensor files: tensor.hpp plus .npy and safetensors (checkpoints) read and written collectively
// through MPI-IO, on any mesh and layout (namespace gshard::io).
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "tensor.hpp"
