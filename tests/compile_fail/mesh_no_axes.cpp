// expect-error: gshard::Mesh: give 1 to 4 axis names
// A mesh with no axes.
#include <gshard/gshard.hpp>

using Bad = gshard::Mesh<>;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
