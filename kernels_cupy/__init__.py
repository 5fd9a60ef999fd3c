"""CUDA/HIP-portable kernels and their CuPy RawModule launchers."""
