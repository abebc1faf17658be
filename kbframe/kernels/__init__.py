"""Kernels: plain Python functions ``kernel(tl, **shape)`` that emit commands through tl."""
