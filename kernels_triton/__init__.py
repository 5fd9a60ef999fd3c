"""Triton kernels (2-D grid) and their launchers."""
