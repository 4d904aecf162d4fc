# Sourced by the run scripts: what OpenMPI needs here (as root, oversubscribed, in a sandbox).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# OpenBLAS (the local GEMMs) starts one thread per core in every rank: with several ranks per
# machine those threads oversubscribe the cores and spin against each other. One rank, one thread.
export OPENBLAS_NUM_THREADS=1
