// libFuzzer target: the safetensors header reader (io/format.hpp) on arbitrary file contents.
// A malformed file must end in gshard::Error; an accepted one must describe only bytes the file
// has. Built with clang and ASan/UBSan by run_fuzzer.cmake.
#include <cstdint>
#include <cstdlib>
#include <span>

#include <gshard/io/format.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const char> file(reinterpret_cast<const char*>(data), size);
  try {
    const std::uint64_t n =
        gshard::io::safetensors_header_length(file.first(size < 8 ? size : 8), size, "fuzz");
    const auto h = gshard::io::parse_safetensors_header(file.subspan(8, n), size, "fuzz");
    std::uint64_t at = h.data_start();
    for (const auto& t : h.tensors) {  // back to back, inside the file
      if (h.data_start() + t.begin != at || t.end < t.begin || h.data_start() + t.end > size)
        std::abort();
      at = h.data_start() + t.end;
    }
    if (at != size) std::abort();
  } catch (const gshard::Error&) {
  }
  return 0;
}
