"""SJD-VP on the trained reference model: the default prior may cost at most a tenth of plain SJD's step
compression (it is lossless, so compression is all it can change), and the check must catch a setting that costs
more.

The prior does not pay on this model: the bounded default costs a little compression (docs/results/vp_confirm.md,
"vs base"), which is why the claim is a bound, not "no loss". Per-image compression (``row_step_compression``) of
16 prompts x 2 images in batches of 8, paired by prompt with plain SJD under the same seeds; "within the bound"
means the mean paired difference plus a tenth of SJD's compression is above -2 standard errors.
`python -m benchmarks vp` measures the full sweep (docs/results.md)."""

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


def test_default_vp_costs_at_most_a_tenth_of_sjd_compression(reference):
    sjd = per_image_compression(reference, "sjd")
    allowed = 0.1 * sjd  # [images]
    assert not worse_beyond_noise(per_image_compression(reference, "sjd-vp") - sjd + allowed)
    # power: the raw one-step prior (N = 1, unbounded gain) costs far more than a tenth; it must fail
    raw = per_image_compression(reference, "sjd-vp", vp_growth_steps=1, vp_max_gain=None)
    assert worse_beyond_noise(raw - sjd + allowed)
