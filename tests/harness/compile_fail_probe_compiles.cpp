// expect-error: probe: this case must not compile
// Compiles, so its compile-fail test fails (its self-test expects that failure).
#include <gshard/gshard.hpp>

int main() { return gshard::version_major >= 0 ? 0 : 1; }
