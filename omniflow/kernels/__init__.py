"""Triton kernels for the hot paths of serving.

Each kernel lives beside a plain-torch reference with the same signature (`*_ref.py`), and
the tests check the kernel against that reference (on CPU through the Triton interpreter, on
a GPU at the real shapes). Importing a kernel module never launches anything, so it is safe
on a machine without a GPU.
"""
