"""The explorer page, read back in the system's headless Chromium: what it shows for a chosen image,
layer, head and query equals vit.maps' numbers (as rounded for the page), and it fetches nothing.
Without a browser: its size budget and the command's handling of bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests import browser
from tests.helpers import TINY, write_safetensors
from vit.commands.explore import run_explore
from vit.data.datasets import preprocess
from vit.io.pretrained import available
from vit.maps.capture import attention_maps, patch_grid, query_map
from vit.maps.explorer import SCALE, quantize, write_explorer
from vit.maps.inspection import filter_components, mean_attention_distance, position_similarity
from vit.maps.rollout import grad_rollout, rollout_map
from vit.model.vision_transformer import VisionTransformer

CLASSES = [f"class {k}" for k in range(10)]


def shown(values: torch.Tensor) -> list[str]:
    """How the page writes values: rounded to 1/SCALE, then with 4 decimals."""
    assert SCALE == 10_000
    return [f"{q / SCALE:.4f}" for q in quantize(values).flatten().tolist()]


def images(n: int, *, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


@pytest.fixture(scope="module")
def tiny_page(tmp_path_factory: pytest.TempPathFactory):
    """A seeded tiny model (4x4 patches, 2 layers, 2 heads), two images, the page and the maps."""
    torch.manual_seed(0)
    model = VisionTransformer(**TINY).eval()
    pictures = images(2)
    path = write_explorer(model, pictures, CLASSES, tmp_path_factory.mktemp("page") / "p.html")
    with torch.no_grad():
        logits, maps = attention_maps(model, preprocess(pictures))
    return model, pictures, path, logits, maps


@pytest.fixture(scope="module")
def driver():
    reason = browser.missing()
    if reason:
        pytest.skip(reason)
    chromium = browser.headless_chromium(log_network=True)
    yield chromium
    chromium.quit()


def click(driver, selector: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, selector).click()


def overlay(driver) -> tuple[list[str], str]:
    """The values the overlay shows (data-values) and the CLS key's value (data-cls)."""
    from selenium.webdriver.common.by import By

    node = driver.find_element(By.ID, "overlay")
    return json.loads(node.get_attribute("data-values")), node.get_attribute("data-cls")


def test_a_patch_query_shows_its_row_of_attention_maps(driver, tiny_page) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    _, _, path, _, maps = tiny_page
    browser.open_page(driver, path)
    image, layer, head, query = 1, 1, 0, 6  # query token 6: patch 5, row 1 col 1 of the 4x4 grid
    for selector in (f'#images [data-image="{image}"]', f'#layers [data-layer="{layer}"]',
                     f'#heads [data-head="{head}"]', f'#overlay [data-query="{query}"]'):  # fmt: skip
        click(driver, selector)
    values, cls = overlay(driver)
    row = maps[layer][image, head, query]  # (N,): the CLS key, then 16 patch keys
    assert values == shown(row[1:]) and [cls] == shown(row[:1])
    assert (
        max(abs(float(v) - float(r)) for v, r in zip(values, row[1:], strict=True)) <= 0.5 / SCALE
    )
    cell = driver.find_element(By.CSS_SELECTOR, '#overlay [data-patch="9"]')
    ActionChains(driver).move_to_element(cell).perform()
    assert driver.find_element(By.ID, "hover-value").text == f"patch (2, 1): {values[9]}"
    assert cell.get_attribute("title") == f"patch (2, 1): {values[9]}"


def test_the_cls_query_and_the_mean_over_heads(driver, tiny_page) -> None:
    _, _, path, _, maps = tiny_page
    browser.open_page(driver, path)
    click(driver, '#layers [data-layer="0"]')
    click(driver, '#heads [data-head="1"]')
    click(driver, "#cls-query")
    values, cls = overlay(driver)
    assert values == shown(maps[0][0, 1, 0, 1:]) and [cls] == shown(maps[0][0, 1, 0, :1])
    click(driver, '#heads [data-head="mean"]')
    assert overlay(driver)[0] == shown(maps[0][0].mean(dim=0)[0, 1:])
    click(driver, '#overlay [data-query="16"]')
    assert overlay(driver)[0] == shown(maps[0][0].mean(dim=0)[16, 1:])
    from selenium.webdriver.common.by import By

    assert "CLS query" in driver.find_element(By.ID, "thumbs-hint").text  # a CLS model's hint


def test_rollout_gradient_rollout_and_probabilities(driver, tiny_page) -> None:
    from selenium.webdriver.common.by import By

    model, pictures, path, logits, maps = tiny_page
    browser.open_page(driver, path)
    click(driver, '#images [data-image="1"]')
    click(driver, '#views [data-view="rollout"]')
    assert overlay(driver)[0] == shown(rollout_map(maps, grid=patch_grid(model))[1])
    click(driver, '#probs [data-class="7"]')
    _, cam = grad_rollout(model, preprocess(pictures), target=7)
    assert overlay(driver)[0] == shown(cam[1])
    texts = [li.text.split()[-1] for li in driver.find_elements(By.CSS_SELECTOR, "#probs li")]
    assert texts == shown(logits[1].softmax(dim=-1))


def test_the_layers_by_heads_grid_chooses_a_map(driver, tiny_page) -> None:
    from selenium.webdriver.common.by import By

    _, _, path, _, maps = tiny_page
    browser.open_page(driver, path)
    thumbs = driver.find_elements(By.CSS_SELECTOR, "#thumbs .thumb")
    assert len(thumbs) == TINY["depth"] * (TINY["num_heads"] + 1)
    click(driver, '#thumbs [data-layer="1"][data-head="mean"]')
    assert overlay(driver)[0] == shown(maps[1][0].mean(dim=0)[0, 1:])


def test_the_whole_model_panel_shows_vit_maps_numbers(driver, tiny_page) -> None:
    from selenium.webdriver.common.by import By

    model, pictures, path, _, _ = tiny_page
    browser.open_page(driver, path)
    distance = mean_attention_distance(model, preprocess(pictures))  # over the page's images
    dots = driver.find_elements(By.CSS_SELECTOR, "#distance .head-dot")
    assert len(dots) == TINY["depth"] * TINY["num_heads"]
    for dot in dots:
        layer, head = int(dot.get_attribute("data-layer")), int(dot.get_attribute("data-head"))
        pixels = float(shown(distance.pixels[layer, head])[0])  # stored to 4 decimals, shown to 2
        assert dot.get_attribute("data-value") == f"{pixels:.2f}"
    uniform = driver.find_element(By.CSS_SELECTOR, "#distance .uniform")
    assert uniform.get_attribute("data-value") == f"{distance.uniform * 8:.2f}"
    similarity = position_similarity(model)
    canvas = driver.find_element(By.ID, "positions")
    assert canvas.get_attribute("data-position") == "10"  # the centre patch (2, 2) at first
    assert json.loads(canvas.get_attribute("data-values")) == shown(similarity[10])
    click(driver, '#overlay [data-query="6"]')  # query token 6 is patch 5
    assert json.loads(canvas.get_attribute("data-values")) == shown(similarity[5])
    click(driver, '#distance .head-dot[data-layer="1"][data-head="0"]')
    node = driver.find_element(By.ID, "overlay")
    assert (node.get_attribute("data-layer"), node.get_attribute("data-head")) == ("1", "0")
    _, ratio = filter_components(model, k=16)
    shares = [
        f.get_attribute("data-ratio") for f in driver.find_elements(By.CSS_SELECTOR, ".filter")
    ]
    assert [float(r) for r in shares] == [round(float(r), 4) for r in ratio]


def test_the_page_fetches_nothing(driver, tiny_page) -> None:
    path = tiny_page[2]
    driver.get_log("performance")  # drop what earlier pages asked for
    browser.open_page(driver, path)
    click(driver, '#images [data-image="1"]')
    urls = browser.requested_urls(driver)
    assert urls and all(u.startswith(("data:", "file:")) for u in urls), urls
    html = path.read_text()
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"<script[^>]*\ssrc=|<link[^>]*href=|@import|url\(['\"]?[a-z]+:", html)


def test_without_a_class_token_the_pooled_query_is_shown(driver, tmp_path) -> None:
    torch.manual_seed(1)
    model = VisionTransformer(**TINY, class_token=False, global_pool="avg").eval()
    path = write_explorer(model, images(1), CLASSES, tmp_path / "avg.html")
    with torch.no_grad():
        _, maps = attention_maps(model, preprocess(images(1)))
    browser.open_page(driver, path)
    click(driver, '#heads [data-head="1"]')
    values, cls = overlay(driver)  # the default query: the pooled output's
    assert values == shown(query_map(maps[-1][0, 1], grid=(4, 4), num_prefix_tokens=0)) and not cls
    click(driver, '#overlay [data-query="3"]')
    assert overlay(driver)[0] == shown(maps[-1][0, 1, 3])  # no prefix: all 16 keys are patches
    from selenium.webdriver.common.by import By

    hints = [driver.find_element(By.ID, i).text for i in ("thumbs-hint", "distance-keys")]
    assert "mean of patches" in hints[0] and "no CLS token" in hints[1]
    assert "CLS" not in hints[0]


def test_a_screenshot_of_the_page(tiny_page, tmp_path) -> None:
    from PIL import Image

    if browser.missing():
        pytest.skip(browser.missing())
    png = browser.screenshot(
        tiny_page[2], tmp_path / "shot.png", click=['#overlay [data-patch="5"]']
    )
    with Image.open(png) as shot:
        assert shot.format == "PNG" and shot.size[0] == 1280 and shot.size[1] >= 600
        assert len(set(shot.convert("L").getdata())) > 16  # drawn, not blank


@pytest.fixture(scope="module")
def page16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The budget's case: 16 CIFAR-sized images, a depth-4, width-192, 3-head model."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=192, depth=4, num_heads=3)
    return write_explorer(model, images(16), CLASSES, tmp_path_factory.mktemp("p16") / "p.html")


def test_sixteen_images_fit_in_two_megabytes(page16: Path) -> None:
    assert page16.stat().st_size < 2_000_000


def test_sixteen_images_open_in_under_a_second(driver, page16: Path) -> None:
    times = []
    for _ in range(2):  # the better of two: what the page needs, less a busy machine's noise
        browser.open_page(driver, page16)
        times.append(int(driver.execute_script("return document.body.dataset.loadMs;")))
    assert min(times) < 1000, times  # from navigation start to drawn: parse, unpack, draw


# ---- the command, without a browser ---------------------------------------------------------


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return write_safetensors(
        VisionTransformer(**TINY), tmp_path / "tiny.safetensors", class_names=CLASSES
    )


@pytest.fixture
def picture_files(tmp_path: Path) -> list[Path]:
    from PIL import Image

    paths = []
    for i, size in enumerate((32, 40)):
        paths.append(tmp_path / f"picture{i}.png")
        Image.new("RGB", (size, size), (40 * i, 90, 200)).save(paths[-1])
    return paths


def test_an_existing_page_is_kept_unless_overwrite(weights, picture_files, tmp_path) -> None:
    out = tmp_path / "explorer.html"
    args = [str(weights), "--images", *map(str, picture_files), "--output", str(out)]
    assert run_explore(args) == out and "vit-attention" in out.read_text()
    out.write_text("mine")
    with pytest.raises(FileExistsError, match=r"explorer\.html.*kept.*--overwrite"):
        run_explore(args)
    assert out.read_text() == "mine"
    run_explore([*args, "--overwrite"])
    assert "vit-attention" in out.read_text()


def test_an_undecodable_image_is_named(weights, picture_files, tmp_path, capsys) -> None:
    from vit.commands.explore import explore_main

    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image at all")
    out = tmp_path / "explorer.html"
    with pytest.raises(SystemExit) as exit_:
        explore_main(
            [str(weights), "--images", str(picture_files[0]), str(bad), "--output", str(out)]
        )
    assert exit_.value.code == 2 and "broken.png" in capsys.readouterr().err
    assert not out.exists()


def test_an_unknown_weights_name_lists_the_names(tmp_path) -> None:
    with pytest.raises(ValueError, match="no-such-weights") as err:
        run_explore(["no-such-weights", "--output", str(tmp_path / "e.html")])
    assert available() in str(err.value) and "vit-tiny-d4-cifar10-cpu60" in str(err.value)


def test_a_folder_of_images_is_explored(weights, picture_files, tmp_path, monkeypatch) -> None:
    """`--images my_photos` shows the folder's images, found as vit-predict finds them."""
    import vit.commands.explore as explore
    from vit.commands.visualize import load_image_files

    folder = tmp_path / "my_photos"
    (folder / "more").mkdir(parents=True)
    for i, picture in enumerate(picture_files):
        picture.rename(folder / ("more" if i else ".") / picture.name)
    shown_images = []

    def spy(model, images, *args, **kwargs):
        shown_images.append(images)
        return real(model, images, *args, **kwargs)

    real = explore.write_explorer
    monkeypatch.setattr(explore, "write_explorer", spy)
    out = tmp_path / "explorer.html"
    assert run_explore([str(weights), "--images", str(folder), "--output", str(out)]) == out
    in_order = [folder / "more" / "picture1.png", folder / "picture0.png"]  # sorted by path
    assert torch.equal(shown_images[0], load_image_files(in_order, size=32))
