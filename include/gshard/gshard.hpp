#pragma once
// The umbrella header: users include this and nothing else.
#include "core/error.hpp"
#include "mesh/environment.hpp"
#include "version.hpp"
