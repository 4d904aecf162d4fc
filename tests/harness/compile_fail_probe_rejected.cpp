// expect-error: probe: this case must not compile
// Rejected with the expected message: its compile-fail test passes.
#include <gshard/gshard.hpp>

template <class T>
inline constexpr bool always_false = false;

static_assert(always_false<gshard::Error>, "probe: this case must not compile");

int main() { return 0; }
