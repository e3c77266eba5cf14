"""The test suite. Runs before any test module imports torch's compiler (conftest included)."""

from vit.system.inductor_cache import separate_by_capability

# torch 2.14's inductor cache does not key its CPU kernels on ATEN_CPU_CAPABILITY: one cache folder
# per setting (as the commands do), chosen before vit or lightning import torch._inductor.
separate_by_capability()
