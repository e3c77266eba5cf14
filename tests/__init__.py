"""The test suite. Runs before any test module imports torch's compiler (conftest included)."""

import os

# torch 2.14's inductor cache does not key its CPU kernels on ATEN_CPU_CAPABILITY: a run under one
# setting would take another's cached kernels (a C++ compile error, or NaN logits;
# experiments/record/kernels.md). One cache per setting, chosen before vit or lightning import
# torch._inductor (which fixes the cache folder in the environment on first use).
if os.environ.get("ATEN_CPU_CAPABILITY") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import getpass
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(),
        f"torchinductor_{getpass.getuser()}-{os.environ['ATEN_CPU_CAPABILITY']}",
    )
