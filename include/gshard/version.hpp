#pragma once
// The one place the version is written; CMake reads it from here.
#define GSHARD_VERSION_MAJOR 0
#define GSHARD_VERSION_MINOR 1
#define GSHARD_VERSION_PATCH 0
#define GSHARD_VERSION \
  (GSHARD_VERSION_MAJOR * 10000 + GSHARD_VERSION_MINOR * 100 + GSHARD_VERSION_PATCH)

namespace gshard {
inline constexpr int version_major = GSHARD_VERSION_MAJOR;
inline constexpr int version_minor = GSHARD_VERSION_MINOR;
inline constexpr int version_patch = GSHARD_VERSION_PATCH;
}  // namespace gshard
