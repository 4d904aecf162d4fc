#pragma once
// The umbrella header: everything. Smaller programs may include one layer's header instead
// (each includes the ones it builds on): layouts.hpp (compile-time only), tensor.hpp, einsum.hpp,
// ops.hpp, autodiff.hpp, nn.hpp, io.hpp, trace.hpp; gshard_fwd.hpp declares the main types.
#include "io.hpp"
#include "nn.hpp"
#include "trace.hpp"
#include "version.hpp"
