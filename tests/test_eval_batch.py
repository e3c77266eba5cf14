"""scripts/eval_batch.py: every (model, batch) timed, the ratios to the reference batch."""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_script

eval_batch = load_script("eval_batch")


def test_every_model_and_batch_is_timed_and_written(tmp_path) -> None:
    argv = ["--models", "tiny", "--batches", "4", "8", "--reference", "8", "--images", "16"]
    res = eval_batch.main([*argv, "--rounds", "2", "--name", "t", "--out-dir", str(tmp_path)])
    assert [(r["model"], r["batch"]) for r in res["rows"]] == [("tiny", 4), ("tiny", 8)]
    assert all(r["images_per_s"] > 0 for r in res["rows"])
    by_batch = {r["batch"]: r for r in res["rows"]}
    assert by_batch[8]["vs_reference"] == 1.0
    assert by_batch[4]["vs_reference"] == pytest.approx(
        by_batch[4]["images_per_s"] / by_batch[8]["images_per_s"], rel=0.01
    )
    assert json.loads((tmp_path / "t.json").read_text()) == res
    assert (tmp_path / "t.md").read_text() == eval_batch.to_markdown(res)
    assert "| tiny | 4 |" in eval_batch.to_markdown(res)


def test_the_reference_must_be_a_timed_batch() -> None:
    with pytest.raises(SystemExit):
        eval_batch.main(["--models", "tiny", "--batches", "4", "--reference", "500"])


def test_an_unknown_model_is_named() -> None:
    with pytest.raises(ValueError, match="expected shipped, cifar10 or tiny"):
        eval_batch.models(["vit_huge"])
