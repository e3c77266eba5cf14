"""scripts/product_rates.py: every product and elementwise kernel timed, the ratios from them."""

from __future__ import annotations

import json

from tests.helpers import load_script

rates = load_script("product_rates")


def test_every_product_and_elementwise_kernel_is_timed_and_written(tmp_path) -> None:
    res = rates.main(
        [
            "--precision",
            "32-true",
            "--tokens",
            "32",
            "64",
            "--width",
            "16",
            "--mlp",
            "32",
            "--heads",
            "2",
            "--seq",
            "16",
            "--square",
            "64",
            "--rounds",
            "1",
            "--name",
            "t",
            "--out-dir",
            str(tmp_path),
        ]
    )
    rows = {(r["tokens"], r["layer"], r["product"]) for r in res["products"]}
    assert len(rows) == 2 * 4 * 4 + 2  # 4 products of 4 layers per token count, 2 of attention
    assert {r["tokens"] for r in res["products"] if r["layer"] == "attention"} == {64}
    assert all(r["ms"] > 0 and r["gflop_per_s"] > 0 for r in res["products"])
    ops = ("gelu forward", "gelu backward", "g^T copy (64 x 48)", "g^T copy (64 x 32)")
    assert {(r["op"], r["kernels"]) for r in res["elementwise"]} == {
        (op, kind) for op in ops for kind in ("eager", "compiled")
    }
    assert json.loads((tmp_path / "t.json").read_text()) == res
    assert (tmp_path / "t.md").read_text() == rates.to_markdown(res)


def test_the_table_divides_by_the_square_rate_and_by_eager() -> None:
    res = dict(
        command="c",
        date="d",
        machine="m",
        torch="t",
        threads=2,
        precision="32-true",
        square=64,
        square_gflop_per_s=200.0,
        products=[dict(tokens=8, layer="qkv", product="p", ms=1.0, gflop_per_s=50.0)],
        elementwise=[
            dict(tokens=8, op="gelu forward", kernels="eager", ms=1.5),
            dict(tokens=8, op="gelu forward", kernels="compiled", ms=3.0),
        ],
    )
    md = rates.to_markdown(res)
    assert "| 8 | qkv | p | 1.0 | 50 | 25% |" in md
    assert "| 8 | gelu forward | compiled | 3.0 | 2.00x |" in md
    assert "| 8 | gelu forward | eager | 1.5 | 1.00x |" in md
