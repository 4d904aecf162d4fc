// Anchors the precompiled-header targets (cmake/gshardTesting.cmake); compiles to nothing.
