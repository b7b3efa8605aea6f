"""Phrase libraries for every image-model family: ``adapter.encode_images`` is the model's own tokenization,
and ``hf-sjd build-phrases --model <checkpoint folder>`` builds a library that drives ``sjd-pv`` on that model
with the fingerprint check on.

Checkpoints are the tiny random Emu3 / Janus / Chameleon models of ``adapter_models``, saved with
``save_pretrained`` next to an image processor whose size fits their VQ (8 x 8 px images -> 4 x 4 codes).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

import hf_sjd
from adapter_models import JANUS_BOI, emu3_prompt, tiny_chameleon, tiny_emu3, tiny_janus
from hf_sjd import PhraseLibrary, cli

SIDE, CODES_PER_IMAGE, NUM_IMAGES, MERGES = 8, 16, 8, 12
FAMILIES = {  # adapter family -> (tiny model, transformers class, image processor fitting its VQ)
    "emu3": (tiny_emu3, "Emu3ForConditionalGeneration",
             lambda: transformers.Emu3ImageProcessor(min_pixels=SIDE ** 2, max_pixels=SIDE ** 2, spatial_factor=2)),
    "janus": (tiny_janus, "JanusForConditionalGeneration",
              lambda: transformers.JanusImageProcessor(size={"height": SIDE, "width": SIDE}, min_size=1)),
    "lumina-mgpt": (tiny_chameleon, "ChameleonForConditionalGeneration",
                    lambda: transformers.ChameleonImageProcessor(size={"shortest_edge": SIDE},
                                                                 crop_size={"height": SIDE, "width": SIDE})),
}


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")


@pytest.fixture(scope="module")
def images() -> list:
    """8 smooth random 8x8 RGB images (upsampled 2x2 noise, so code runs repeat and BPE finds pairs)."""
    rng = np.random.default_rng(0)
    small = (rng.random((NUM_IMAGES, 2, 2, 3)) * 255).astype("uint8")
    return [Image.fromarray(x).resize((SIDE, SIDE), Image.Resampling.BILINEAR) for x in small]


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory, images):
    folder = tmp_path_factory.mktemp("images")
    for i, image in enumerate(images):
        image.save(folder / f"{i:02d}.png")
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """family -> checkpoint folder (model + image processor, as a Hub repo of that family holds them)."""
    folders = {}
    for family, (make, _, processor) in FAMILIES.items():
        folder = tmp_path_factory.mktemp(family)
        make().save_pretrained(folder)
        processor().save_pretrained(folder)
        folders[family] = folder
    return folders


def load(family: str, folder):
    model = getattr(transformers, FAMILIES[family][1]).from_pretrained(folder).eval()
    return hf_sjd.enable(model), transformers.AutoImageProcessor.from_pretrained(folder)


@torch.no_grad()
def own_codes(model, processor, images: list) -> torch.Tensor:
    """The model's own tokenization (default image processor call, the family's ``get_image_tokens``), as
    indices into ``draft_token_ids`` -- the code -> token map ``PhraseVerifier`` applies."""
    adapter = model.sjd_adapter
    batch = processor(images, return_tensors="pt")
    if adapter.family == "emu3":  # visual BPE ids, each row closed by an end-of-line id
        tokens = model.model.get_image_tokens(batch["pixel_values"], batch["image_sizes"])
        tokens = tokens.view(len(images), 4, 5)[:, :, :4].flatten(1)
    elif adapter.family == "lumina-mgpt":  # image BPE ids
        tokens = model.get_image_tokens(batch["pixel_values"])
    else:  # Janus: image tokens are the VQ codes
        tokens = model.model.vqmodel.encode(batch["pixel_values"]).image_tokens.view(len(images), -1)
    match = tokens[..., None] == adapter.draft_token_ids  # [n, h*w, codebook]
    assert bool(match.any(-1).all())
    return match.int().argmax(-1)


def prompt_for(family: str, model) -> torch.Tensor:
    if family == "emu3":
        return emu3_prompt(2, 3)
    if family == "janus":
        return torch.tensor([[1, 7, 8, JANUS_BOI]])
    return torch.tensor([[1, 30, 31, *model.sjd_adapter.image_header(64, 64)]])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_encode_images_is_the_models_own_tokenization(family, checkpoints, images):
    model, processor = load(family, checkpoints[family])
    codes = model.sjd_adapter.encode_images(images, processor)
    assert codes.shape == (NUM_IMAGES, CODES_PER_IMAGE) and codes.dtype == torch.long
    assert torch.equal(codes, own_codes(model, processor, images))
    assert len(codes.unique()) > 3  # a real test: the images do not all map to one code
    assert model.sjd_adapter.encoder_image_size(processor) == SIDE
    with pytest.raises(ValueError, match=r"(multiple of the VQ factor|must be 8x8 px)"):
        model.sjd_adapter.encode_images([image.resize((SIDE + 1, SIDE + 1)) for image in images[:2]], processor)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_built_library_drives_sjd_pv_with_the_fingerprint_check(family, checkpoints, image_folder, images, tmp_path):
    out = tmp_path / "phrases"
    argv = ["build-phrases", "--model", str(checkpoints[family]), "--dataset", str(image_folder), "--merges",
            str(MERGES), "--out", str(out), "--device", "cpu", "--no-progress"]
    assert cli.main(argv) == 0
    model, processor = load(family, checkpoints[family])
    adapter = model.sjd_adapter
    library = PhraseLibrary.from_pretrained(out)
    assert library.fingerprint == adapter.tokenizer_fingerprint
    assert library.codebook_size == len(adapter.draft_token_ids)
    expected = PhraseLibrary.from_token_sequences(own_codes(model, processor, images), num_merges=MERGES,
                                                  codebook_size=len(adapter.draft_token_ids))
    assert len(library) > 0
    assert torch.equal(library.phrases, expected.phrases) and torch.equal(library.counts, expected.counts)
    meta = library.metadata
    assert meta["corpus"]["tokens"] == NUM_IMAGES * CODES_PER_IMAGE and meta["grid"] == [4, 4]
    assert meta["source"]["family"] == family and meta["build"]["command"].startswith("hf-sjd build-phrases")

    prompt = prompt_for(family, model)
    torch.manual_seed(0)
    result = model.generate(prompt, do_sample=True, top_k=6, custom_generate="sjd-pv", phrase_library=str(out),
                            jacobi_window=4, return_dict_in_generate=True)  # fingerprint checked: no override
    new = result.sequences[:, prompt.shape[1]:]
    assert result.stats.num_new_tokens.tolist() == [new.shape[1]]
    # the check is on: the same library under another model's fingerprint is refused
    other = next(f for f in FAMILIES if f != family)
    stranger, _ = load(other, checkpoints[other])
    with pytest.raises(ValueError, match="fingerprint"):
        stranger.generate(prompt_for(other, stranger), custom_generate="sjd-pv", phrase_library=str(out),
                          jacobi_window=4)


def test_checkpoint_without_image_processor_or_of_the_wrong_size(image_folder, tmp_path, capsys):
    tiny_emu3().save_pretrained(tmp_path / "bare")  # no preprocessor_config.json
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build-phrases", "--model", str(tmp_path / "bare"), "--dataset", str(image_folder),
                  "--out", str(out), "--no-progress"])
    message = capsys.readouterr().err
    assert exit_info.value.code == 2 and "has no usable image processor" in message and "--model" in message
    assert not out.exists()
    FAMILIES["emu3"][2]().save_pretrained(tmp_path / "processor")  # --image-processor: one from elsewhere
    assert cli.main(["build-phrases", "--model", str(tmp_path / "bare"), "--image-processor",
                     str(tmp_path / "processor"), "--dataset", str(image_folder), "--merges", "4",
                     "--out", str(tmp_path / "lib"), "--no-progress"]) == 0
    bare = hf_sjd.enable(transformers.Emu3ForConditionalGeneration.from_pretrained(tmp_path / "bare"))
    assert PhraseLibrary.from_pretrained(tmp_path / "lib").fingerprint == bare.sjd_adapter.tokenizer_fingerprint
    tiny_janus().save_pretrained(tmp_path / "janus")
    FAMILIES["janus"][2]().save_pretrained(tmp_path / "janus")
    with pytest.raises(SystemExit) as exit_info:  # Janus's VQ grid fixes the size: refused before tokenizing
        cli.main(["build-phrases", "--model", str(tmp_path / "janus"), "--dataset", str(image_folder),
                  "--image-size", "16", "--out", str(out), "--no-progress"])
    assert exit_info.value.code == 2 and "images must be 8x8 px" in capsys.readouterr().err
    assert not out.exists()


def test_llamagen_encoder_is_the_checkpoints_vq_and_checks_its_fingerprint():
    """The reference model's adapter finds ``vq/`` next to ``ar/``, encodes with it (codes == image token ids,
    since ``image_token_range`` starts at 0), and refuses a VQ whose codebook is not the config's."""
    from hf_sjd import reference
    from hf_sjd.reference.data import make_dataset, to_pil

    ref = reference.load()
    adapter = hf_sjd.enable(ref.model).sjd_adapter
    images = to_pil(make_dataset(1, seed=3)[0][:3])
    codes = adapter.encode_images(images)
    assert adapter.encoder_image_size() == 64 and codes.shape == (3, 256)
    pixels = torch.from_numpy(np.stack([np.asarray(image) for image in images])).permute(0, 3, 1, 2)
    assert torch.equal(codes, ref.vq.encode(pixels.float() / 127.5 - 1).flatten(1))  # the VQ's [-1, 1] input
    ref.model.config.vq_fingerprint = "0" * 16
    with pytest.raises(ValueError, match="another model's tokenizer"):
        adapter.encode_images(images)


def test_adapters_without_an_encoder_say_so():
    from toy import tiny_llama

    adapter = hf_sjd.enable(tiny_llama(20)).sjd_adapter
    with pytest.raises(NotImplementedError, match=r"'causal-lm' adapter .* has no image encoder"):
        adapter.encode_images([Image.new("RGB", (8, 8))])
