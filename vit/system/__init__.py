"""What the machine offers (bf16, a C++ compiler, the device), the MKL switch for AMD CPUs, glibc
malloc's thresholds, the inductor cache's folder per kernel setting, the cache folder and the
commands' error handling. Imports no other vit module."""
