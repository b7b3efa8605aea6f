"""Offline image data for the reference model: one class per photo bundled in ``skimage.data``, random crops
at several scales plus flips giving as many 64x64 images as wanted, all derived from a seed (never committed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

IMAGE_SIZE = 64


@dataclass(frozen=True)
class ImageClass:
    name: str  # the prompt a user types, e.g. ``hf-sjd generate "coffee"``
    source: str  # attribute of ``skimage.data``
    caption: str


# One class per bundled photo. Order defines the condition-token ids; never reorder.
CLASSES: tuple[ImageClass, ...] = (
    ImageClass("astronaut", "astronaut", "a portrait of an astronaut in front of a flag"),
    ImageClass("cat", "chelsea", "a ginger cat"),
    ImageClass("coffee", "coffee", "a cup of coffee on a saucer"),
    ImageClass("rocket", "rocket", "a rocket on the launch pad"),
    ImageClass("galaxies", "hubble_deep_field", "a deep field of distant galaxies"),
    ImageClass("tissue", "immunohistochemistry", "a stained tissue micrograph"),
    ImageClass("retina", "retina", "a photograph of a human retina"),
    ImageClass("colorwheel", "colorwheel", "a colour wheel"),
    ImageClass("logo", "logo", "the scikit-image logo"),
    ImageClass("brick", "brick", "a brick wall"),
    ImageClass("grass", "grass", "a patch of grass"),
    ImageClass("gravel", "gravel", "gravel"),
    ImageClass("coins", "coins", "old coins on a table"),
    ImageClass("cameraman", "camera", "a man with a camera on a tripod"),
    ImageClass("moon", "moon", "the surface of the moon"),
    ImageClass("clock", "clock", "a clock on a wall"),
)
CLASS_NAMES: tuple[str, ...] = tuple(c.name for c in CLASSES)


def load_source_photo(source: str) -> np.ndarray:
    """Return a bundled photo as ``[H, W, 3] uint8`` RGB (grayscale is repeated, alpha composited on white)."""
    import skimage.data

    image = np.asarray(getattr(skimage.data, source)())
    if image.dtype == bool:
        image = image.astype(np.uint8) * 255
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=-1)
    if image.shape[-1] == 4:
        alpha = image[..., 3:4].astype(np.float32) / 255.0
        image = (image[..., :3] * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
    return image


def random_crops(photo: np.ndarray, num_crops: int, generator: torch.Generator,
                 min_scale: float = 0.2, max_scale: float = 0.9) -> torch.Tensor:
    """Random square crops (side = scale * shorter side), resized to 64x64, randomly flipped:
    ``[num_crops, 3, 64, 64]`` in [-1, 1]."""
    tensor = torch.from_numpy(photo).permute(2, 0, 1).float().div(127.5).sub(1.0)  # [3, H, W]
    _, height, width = tensor.shape
    short = min(height, width)
    scales = min_scale + (max_scale - min_scale) * torch.rand(num_crops, generator=generator)
    crops = []
    for scale in scales.tolist():  # crop sizes differ, so this loop is per image (offline only)
        side = max(IMAGE_SIZE // 2, int(scale * short))
        top = int(torch.randint(0, height - side + 1, (1,), generator=generator))
        left = int(torch.randint(0, width - side + 1, (1,), generator=generator))
        crop = tensor[:, top:top + side, left:left + side].unsqueeze(0)
        crop = torch.nn.functional.interpolate(crop, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear",
                                               antialias=True, align_corners=False)
        if torch.rand(1, generator=generator).item() < 0.5:
            crop = crop.flip(-1)
        crops.append(crop)
    return torch.cat(crops).clamp(-1.0, 1.0)


def make_dataset(num_per_class: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Crops of every class: images ``[N, 3, 64, 64]`` in [-1, 1] and labels ``[N]`` (class index)."""
    generator = torch.Generator().manual_seed(seed)
    images, labels = [], []
    for label, image_class in enumerate(CLASSES):
        images.append(random_crops(load_source_photo(image_class.source), num_per_class, generator))
        labels.append(torch.full((num_per_class,), label, dtype=torch.long))
    return torch.cat(images), torch.cat(labels)


def to_pil(images: torch.Tensor) -> list:
    """``[N, 3, H, W]`` in [-1, 1] -> list of PIL RGB images."""
    from PIL import Image

    array = images.detach().float().clamp(-1, 1).add(1).mul(127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(a) for a in array]
