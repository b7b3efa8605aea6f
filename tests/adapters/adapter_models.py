"""Tiny randomly initialised Emu3 / Janus / Chameleon models (the real transformers classes; correctness only).

Random init gives near-uniform, repetitive greedy outputs, so the language-model weights are redrawn with
a larger scale: greedy sequences then vary, which is what makes the equality tests meaningful.
"""

from __future__ import annotations

import torch
from transformers import (ChameleonConfig, ChameleonForConditionalGeneration, Emu3Config, Emu3ForConditionalGeneration,
                          JanusConfig, JanusForConditionalGeneration, LogitsProcessor)

import hf_sjd

TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=256)


def _sharpen(model, seed: int, skip: str = "vqmodel") -> None:
    generator = torch.Generator().manual_seed(seed)  # the CPU's: the same weights on every test device
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.ndim == 2 and skip not in name:
                weight.copy_(torch.randn(weight.shape, generator=generator, device="cpu") * 2 / weight.shape[1] ** 0.5)


# -- Emu3 --------------------------------------------------------------------------------------------------
EMU3_CODES, EMU3_VISUAL0 = 16, 20  # visual token i has id 20 + i
EMU3_EOL, EMU3_EOF, EMU3_BOI, EMU3_EOI, EMU3_WRAPPER, EMU3_STAR, EMU3_DIGIT0 = 40, 41, 42, 43, 44, 46, 50


def tiny_emu3(seed: int = 0):
    torch.manual_seed(seed)
    vocab = {f"<|visual token {i:06d}|>": EMU3_VISUAL0 + i for i in range(EMU3_CODES)}
    vocab.update({"<|extra_200|>": EMU3_EOL, "<|extra_201|>": EMU3_EOF, "<|image start|>": EMU3_BOI,
                  "<|image end|>": EMU3_EOI, "<|image token|>": EMU3_WRAPPER, "<image>": 45, "*": EMU3_STAR,
                  "<|endoftext|>": 0, "<|extra_203|>": 1, "<|extra_204|>": 2})
    vocab.update({str(d): EMU3_DIGIT0 + d for d in range(10)})
    config = Emu3Config(vocabulary_map=vocab, text_config=dict(vocab_size=64, **TEXT),
                        vq_config=dict(codebook_size=EMU3_CODES, embed_dim=4, latent_channels=4, base_channels=32,
                                       channel_multiplier=[1, 1], num_res_blocks=1, attn_resolutions=[],
                                       temporal_downsample_factor=2, hidden_size=32, num_attention_heads=1))
    model = Emu3ForConditionalGeneration(config).eval()
    _sharpen(model, seed)
    return hf_sjd.enable(model)


def emu3_prompt(height: int, width: int, text=(30, 31, 32)) -> torch.Tensor:
    """``<bos> text <|image start|>{H}*{W}<|image token|>`` as Emu3Processor(return_for_image_generation=True)."""
    digits = lambda n: [EMU3_DIGIT0 + int(c) for c in str(n)]  # noqa: E731
    return torch.tensor([[1, *text, EMU3_BOI, *digits(height), EMU3_STAR, *digits(width), EMU3_WRAPPER]])


def emu3_prefix_allowed_tokens_fn(height: int, width: int):
    """The ``prefix_allowed_tokens_fn`` of the transformers Emu3 docs (image generation example)."""
    visual = list(range(EMU3_VISUAL0, EMU3_VISUAL0 + EMU3_CODES))

    def allowed(batch_id, input_ids):
        position = torch.nonzero(input_ids == EMU3_WRAPPER, as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        if offset % (width + 1) == 0:
            return (EMU3_EOL,)
        if offset == (width + 1) * height + 1:
            return (EMU3_EOF,)
        if offset == (width + 1) * height + 2:
            return (EMU3_EOI,)
        if offset == (width + 1) * height + 3:
            return (2,)  # eos
        if offset > (width + 1) * height + 3:
            return (0,)  # pad
        return visual

    return allowed


# -- Janus -------------------------------------------------------------------------------------------------
JANUS_BOI, JANUS_CODES, JANUS_SIDE = 5, 24, 4


def tiny_janus(seed: int = 0):
    torch.manual_seed(seed)
    config = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=64, **TEXT),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8,
                           projection_dim=32, num_image_tokens=JANUS_SIDE ** 2, intermediate_size=64),
        vq_config=dict(embed_dim=8, num_embeddings=JANUS_CODES, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, num_patches=JANUS_SIDE, projection_dim=32,
                       image_token_embed_dim=32, num_hidden_layers=2),
        image_token_id=60)
    model = JanusForConditionalGeneration(config).eval()
    model.generation_config.generation_kwargs = {"boi_token_id": JANUS_BOI}
    _sharpen(model, seed)
    return hf_sjd.enable(model)


# -- Chameleon / Lumina-mGPT -------------------------------------------------------------------------------
CHAM_CODES, CHAM_IMAGE0 = 16, 4
CHAM_EOSS, CHAM_START, CHAM_EOL, CHAM_SIZE0 = 20, 21, 22, 23  # size token <reserved0880n> = 23 + n


def _image_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(c)) for c in str(code)) + "Z"


def tiny_chameleon(seed: int = 2):  # seed 2: varied greedy sequences, with and without CFG
    torch.manual_seed(seed)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<image>": 3}
    vocab.update({_image_name(i): CHAM_IMAGE0 + i for i in range(CHAM_CODES)})
    vocab.update({"<eoss>": CHAM_EOSS, "<racm3:break>": CHAM_START, "<reserved08799>": CHAM_EOL})
    vocab.update({f"<reserved{8800 + n:05d}>": CHAM_SIZE0 + n for n in range(8)})
    config = ChameleonConfig(vocab_size=48, vocabulary_map=vocab, **TEXT,
                             vq_config=dict(embed_dim=8, num_embeddings=CHAM_CODES, latent_channels=32, resolution=32,
                                            base_channels=32, channel_multiplier=[1, 1], num_res_blocks=1))
    model = ChameleonForConditionalGeneration(config).eval()
    _sharpen(model, seed)
    return hf_sjd.enable(model)


class LuminaImageConstraint(LogitsProcessor):
    """Port of Lumina-mGPT's ``MultiModalLogitsProcessor`` (batch of 1, like the original): inside an image,
    force end-of-line after each row and ``<eoss>`` after the last, allow only image tokens elsewhere."""

    def __call__(self, input_ids, scores):
        ids = input_ids[0]
        starts = (ids == CHAM_START).nonzero()
        if not len(starts) or len(ids) - int(starts[-1]) - 1 < 2:
            return scores
        start = int(starts[-1])
        h, w = 2 * (int(ids[start + 1]) - CHAM_SIZE0), 2 * (int(ids[start + 2]) - CHAM_SIZE0)
        n = len(ids[start + 3:]) + 1
        out = torch.full_like(scores, -float("inf"))
        if n % (w + 1) == 0:
            out[:, CHAM_EOL] = 0
        elif n == (w + 1) * h + 1:
            out[:, CHAM_EOSS] = 0
        else:
            image = slice(CHAM_IMAGE0, CHAM_IMAGE0 + CHAM_CODES)
            out[:, image] = scores[:, image]
        return out


@torch.no_grad()
def lumina_greedy(model, prompt: torch.Tensor, num_new: int, guidance_scale: float | None = None) -> torch.Tensor:
    """Lumina-mGPT's own AR loop, greedily: unmasked ``lm_head`` logits, its image-start-triggered CFG
    (unconditional context = the sequence from the image-start token on), then its image constraint."""
    ids = prompt.clone()
    constraint = LuminaImageConstraint()

    def last_logits(seq):
        return model.lm_head(model.model(input_ids=seq).last_hidden_state[:, -1])

    for _ in range(num_new):
        scores = last_logits(ids)
        if guidance_scale is not None:
            start = int((ids[0] == CHAM_START).nonzero()[-1])
            uncond = last_logits(ids[:, start:])
            scores = uncond + guidance_scale * (scores - uncond)
        ids = torch.cat([ids, constraint(ids, scores).argmax(-1, keepdim=True)], dim=1)
    return ids


def guided(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """transformers' CFG (``UnbatchedClassifierFreeGuidanceLogitsProcessor``): over log-probabilities, what a
    processor that is not known to ignore a constant shift of the scores (``FirstScores``) sees."""
    cond, uncond = cond.log_softmax(-1), uncond.log_softmax(-1)
    return scale * (cond - uncond) + uncond


class FirstScores(LogitsProcessor):
    """Records the scores of the first call (the first window position of the first forward)."""

    def __init__(self):
        self.scores = None

    def __call__(self, input_ids, scores):
        if self.scores is None:
            self.scores = scores.clone()
        return scores
