"""A small image classifier over the reference classes.

Used as the project's quality proxy on the reference model: class consistency of generated images with
their prompt (the CLIP-score analogue) and a Frechet distance on its penultimate features (FD-ref, the
FID analogue). Trained by ``scripts/train_reference_model.py`` and shipped with the package.
"""

from __future__ import annotations

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn


class ReferenceClassifier(nn.Module, PyTorchModelHubMixin, library_name="hf_sjd", tags=["image-classification"]):
    def __init__(self, num_classes: int = 16, channels: int = 32, feature_dim: int = 64) -> None:
        super().__init__()
        c = channels

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

        self.features = nn.Sequential(
            block(3, c), block(c, 2 * c), block(2 * c, 2 * c), block(2 * c, 4 * c),  # 64 -> 4
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * c, feature_dim), nn.ReLU(),
        )
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[N, 3, 64, 64]`` in [-1, 1] -> logits ``[N, classes]``."""
        return self.head(self.features(images))

    @torch.no_grad()
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Penultimate features ``[N, feature_dim]`` for Frechet distances."""
        return self.features(images)
