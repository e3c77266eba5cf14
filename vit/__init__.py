"""vit: a Vision Transformer for CIFAR-10, built from first principles with PyTorch Lightning."""

from vit import mkl_amd

# First, before anything imports torch: MKL's AVX2 kernels on AMD CPUs (vit/mkl_amd.py).
mkl_amd.enable()
