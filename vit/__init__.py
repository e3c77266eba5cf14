"""vit: a Vision Transformer for CIFAR-10, built from first principles with PyTorch Lightning.

Importing it only defines things; process-wide switches (vit/mkl_amd.py) belong to the commands.
"""
