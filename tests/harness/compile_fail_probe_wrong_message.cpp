// expect-error: probe: this case must not compile
// Rejected, but with another message: its compile-fail test fails (its self-test expects that
// failure).
#include <gshard/gshard.hpp>

template <class T>
inline constexpr bool always_false = false;

static_assert(always_false<gshard::Error>, "probe: some other reason");

int main() { return 0; }
