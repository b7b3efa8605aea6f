"""SJD-VP on the trained reference model: the default prior must not cost step compression beyond seed noise
(it is lossless, so compression is all it can change), and the check must catch a setting that does.

Per-image compression (``row_step_compression``) of 16 prompts x 2 images in batches of 8, paired by prompt
with plain SJD under the same seeds; "within noise" means the mean paired difference is above -2 standard
errors. `python -m benchmarks vp` measures the full sweep (docs/results.md)."""

import math

import torch

PER_PROMPT, BATCH = 2, 8


@torch.no_grad()
def per_image_compression(reference, method, **knobs):
    prompts = reference.prompt_ids([p for p in reference.conditions for _ in range(PER_PROMPT)])
    values = []
    for index, chunk in enumerate(prompts.split(BATCH)):
        torch.manual_seed(index)
        out = reference.model.generate(chunk, custom_generate=method, do_sample=True, top_k=100, max_new_tokens=256,
                                       jacobi_window=16, return_dict_in_generate=True, **knobs)
        values.append(out.stats.row_step_compression)
    return torch.cat(values)


def worse_beyond_noise(diff: torch.Tensor) -> bool:
    return float(diff.mean()) < -2 * float(diff.std()) / math.sqrt(len(diff))


def test_default_vp_is_not_worse_than_sjd(reference):
    sjd = per_image_compression(reference, "sjd")
    assert not worse_beyond_noise(per_image_compression(reference, "sjd-vp") - sjd)
    # power: the raw one-step prior (N = 1, unbounded gain) measured -1.07 +- 0.16 tokens/forward; it must fail
    assert worse_beyond_noise(per_image_compression(reference, "sjd-vp", vp_growth_steps=1, vp_max_gain=None) - sjd)
