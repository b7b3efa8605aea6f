"""The LlamaGen-style layout (the shipped reference model): an image is exactly height x width new tokens."""

import pytest
import torch
from transformers import GenerationConfig

from toy import no_forward


def test_max_new_tokens_is_filled_in_from_the_grid(reference):
    out = reference.model.generate(reference.prompt_ids(["coffee"]), custom_generate="mc-sjd", do_sample=True,
                                   top_k=100, return_dict_in_generate=True)
    assert out.sequences.shape == (1, 1 + 256)
    assert len(reference.decode(out.sequences)) == 1
    assert len(reference.model.sjd_adapter.decode_images(out.sequences, vq_tokenizer=reference.vq)) == 1


@pytest.mark.parametrize("length", [dict(max_new_tokens=100), dict(max_new_tokens=300), dict(max_length=20),
                                    dict(generation_config=GenerationConfig(do_sample=True, max_length=20))])
def test_another_length_is_refused_before_any_forward(reference, length):
    with no_forward(reference.model):
        with pytest.raises(ValueError, match=r"llamagen: a 16x16 image is 256 new tokens .* pass max_new_tokens=256"):
            reference.model.generate(reference.prompt_ids(["coffee"]), custom_generate="sjd", do_sample=True, **length)


def test_decode_refuses_sequences_that_are_not_one_image(reference):
    codes = torch.randint(0, 512, (2, 256))
    prompt = reference.prompt_ids(["coffee", "cat"])
    assert len(reference.decode(torch.cat([prompt, codes], 1))) == 2
    assert len(reference.decode(codes)) == 2  # bare codes
    with pytest.raises(ValueError, match=r"expected sequences \[batch, prompt \+ 256\]"):
        reference.decode(torch.cat([prompt, codes[:, :100]], 1))
    with pytest.raises(ValueError, match="more than one image's 256 tokens"):
        reference.decode(torch.cat([prompt, codes, codes[:, :44]], 1))  # max_new_tokens=300
    with pytest.raises(ValueError, match="not all image tokens"):
        reference.decode(torch.cat([prompt, codes[:, :255], prompt[:, :1]], 1))


def test_a_class_with_a_generate_of_its_own_is_refused_as_on_the_text_path(reference):
    """A LlamaGen-style checkpoint whose class overrides ``generate`` (its own loop around each step) is refused by
    ``enable``, as a text model's is: a Jacobi call would run GenerationMixin's loop instead, skipping it."""
    import hf_sjd
    from hf_sjd.reference import ar_config
    from transformers import LlamaForCausalLM

    class OwnLoop(LlamaForCausalLM):
        def generate(self, *args, **kwargs):
            return super().generate(*args, **{**kwargs, "top_k": 1})

    with pytest.raises(hf_sjd.UnsupportedModelError, match=r"\(a generate of its own\): OwnLoop.generate replaces"):
        hf_sjd.enable(OwnLoop(ar_config()).eval())
