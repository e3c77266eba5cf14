"""What the machine offers (vit/system/hardware.py): bf16 counts as fast only where it is native."""

from __future__ import annotations

import pytest

from vit.system import hardware


@pytest.mark.parametrize(
    ("flags", "fast"),
    [
        ({"avx2", "fma"}, False),  # AVX2 only: a reference kernel
        ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, False),  # AVX-512, bf16 emulated
        ({"avx2", "avx512f", "avx512_bf16"}, True),  # AMD Zen 4, Intel Cooper Lake
        ({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, True),  # Intel with AMX
        ({"avx2", "avx512f", "amx_bf16"}, True),
    ],
)
def test_bf16_is_fast_only_where_the_cpu_has_it_natively(
    monkeypatch: pytest.MonkeyPatch, flags: set[str], fast: bool
) -> None:
    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    assert hardware.cpu_has_fast_bf16() is fast


@pytest.mark.parametrize(("value", "fast"), [("0", False), ("1", True), ("", True)])
def test_vit_cpu_bf16_0_takes_the_float32_path_on_a_bf16_cpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str, fast: bool
) -> None:
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx2", "avx512f", "amx_bf16"})
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("VIT_CPU_BF16", value)
    assert hardware.cpu_has_fast_bf16() is fast
    with caplog.at_level("WARNING"):
        precision = hardware.cpu_precision("bf16-mixed", "cpu")
    assert precision == ("bf16-mixed" if fast else "32-true")
    assert ("VIT_CPU_BF16=0" in caplog.text) is not fast  # the warning says why


def test_vit_cpu_bf16_refuses_a_value_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIT_CPU_BF16", "false")
    with pytest.raises(ValueError, match=r"VIT_CPU_BF16='false': expected 0 .* or 1"):
        hardware.cpu_has_fast_bf16()


def test_without_cpu_flags_onednn_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cpu_flags", lambda: None)
    monkeypatch.setattr(hardware.torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert hardware.cpu_has_fast_bf16() is True


def test_this_machines_flags_are_read() -> None:
    flags = hardware.cpu_flags()
    assert flags is None or (isinstance(flags, set) and all(isinstance(f, str) for f in flags))
