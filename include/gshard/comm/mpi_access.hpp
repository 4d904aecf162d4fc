#pragma once
// The one place where data crosses from Kokkos kernels to MPI: a buffer MPI can read and write.
// Host-accessible memory goes to MPI as it is; device memory too when the MPI library takes
// device pointers (CUDA- or ROCm-aware, asked once at run time), else through a host mirror.
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_Query_cuda_support, MPIX_Query_rocm_support
#endif
#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <string_view>
#include <utility>

namespace gshard::detail {

/// Whether this MPI takes pointers into the default execution space's memory. Asked of the MPI
/// library once (Open MPI's MPIX_Query_cuda_support / MPIX_Query_rocm_support); the environment
/// variable GSHARD_MPI_DEVICE_AWARE=0 or 1 overrides the answer (1 with an MPI that is not
/// device-aware crashes in the first collective).
inline bool mpi_device_aware() {
  static const bool aware = [] {
    if (const char* e = std::getenv("GSHARD_MPI_DEVICE_AWARE"); e != nullptr && *e != '\0')
      return std::string_view(e) != "0";
#if defined(KOKKOS_ENABLE_CUDA) && defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() == 1;
#elif defined(KOKKOS_ENABLE_HIP) && defined(MPIX_ROCM_AWARE_SUPPORT) && MPIX_ROCM_AWARE_SUPPORT
    return MPIX_Query_rocm_support() == 1;
#else
    return false;
#endif
  }();
  return aware;
}

/// How a collective reaches a View: the View itself or a host copy.
template <class T>
class MpiAccess {
 public:
  using View = Kokkos::View<T*>;
  static constexpr bool host_accessible =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename View::memory_space>::accessible;

  MpiAccess(View view, bool copy_in) : view_(std::move(view)) {
    // Kernels run asynchronously on devices: what wrote the View must finish before MPI reads
    // it, and nothing may still read it when MPI writes. The only fence on an op's path.
    Kokkos::DefaultExecutionSpace().fence();
    if (direct()) return;
    host_ = Kokkos::create_mirror_view(view_);
    if (copy_in) Kokkos::deep_copy(host_, view_);
  }
  [[nodiscard]] T* data() const { return direct() ? view_.data() : host_.data(); }
  void copy_out() const {
    if (!direct()) Kokkos::deep_copy(view_, host_);
  }
  /// Whether MPI sees the View's own memory (no staging copy).
  [[nodiscard]] static bool direct() { return host_accessible || mpi_device_aware(); }

 private:
  View view_;
  decltype(Kokkos::create_mirror_view(
      std::declval<View&>())) host_;  // not HostMirror: renamed in 5.x
};

}  // namespace gshard::detail
