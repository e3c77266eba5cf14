"""vit.runtime: the allocator setting is applied on glibc, can be turned off, and changes no number."""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys

import pytest

from tests.conftest import REPO
from vit.runtime import keep_freed_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# a few training steps of a small ViT, big enough that its activations exceed glibc's default
# mmap threshold; prints a hash of the final weights
TRAIN = """
import hashlib, torch, torch.nn.functional as F
from vit.runtime import keep_freed_memory
print(keep_freed_memory())
from vit.model import VisionTransformer
torch.manual_seed(0)
model = VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2,
                          num_classes=10, drop_rate=0.1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).float(), y)
    loss.backward(); opt.step(); opt.zero_grad()
h = hashlib.sha256()
for t in model.state_dict().values():
    h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
print(h.hexdigest())
"""


def test_env_var_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIT_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory() is False


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_applied_on_glibc() -> None:
    assert keep_freed_memory() is True


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_training_is_bitwise_the_same_with_and_without() -> None:
    out = {}
    for flag in ("0", "1"):
        run = subprocess.run(
            [sys.executable, "-c", TRAIN],
            cwd=REPO,
            env={"VIT_KEEP_FREED_MEMORY": flag, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        out[flag] = run.stdout.split()
    assert out["0"][0] == "False" and out["1"][0] == "True"  # the setting really differed
    assert len(out["0"][1]) == len(hashlib.sha256().hexdigest())
    assert out["0"][1] == out["1"][1]  # the same weights, bit for bit
