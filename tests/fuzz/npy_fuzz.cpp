// libFuzzer target: the .npy header reader (io/format.hpp) on arbitrary file contents. A malformed
// file must end in gshard::Error; an accepted one must describe exactly the bytes after its
// header. Built with clang and ASan/UBSan by run_fuzzer.cmake.
#include <cstdint>
#include <cstdlib>
#include <span>

#include <gshard/io/format.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const char> file(reinterpret_cast<const char*>(data), size);
  try {
    const std::uint64_t start =
        gshard::io::npy_header_length(file.first(size < 12 ? size : 12), size, "fuzz");
    const auto h = gshard::io::parse_npy_header(file.first(start), size, "fuzz");
    if (h.data_start != start || h.data_start + h.data_bytes != size) std::abort();
  } catch (const gshard::Error&) {
  }
  return 0;
}
