#!/usr/bin/env python
"""Regenerate the reference model from scratch: data -> VQ tokenizer -> classifier -> AR model.

Fixed step counts and seeds (not time budgets), so a rerun gives the same files up to floating-point
nondeterminism. Takes about 20 minutes on 2 CPU cores. Writes fp16 safetensors plus ``report.json``
(the model-card facts the README and tests quote) to ``--out`` (default: the package's weights folder),
atomically: everything goes to a temporary folder that replaces the target only when complete.

    python scripts/train_reference_model.py [--out DIR] [--stages vq,classifier,ar]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from hf_sjd.reference import (CONDITION_OFFSET, NULL_CONDITION_ID, NUM_CODES, NUM_IMAGE_TOKENS, VOCAB_SIZE, ar_config,
                              weights_dir)
from hf_sjd.reference.classifier import ReferenceClassifier
from hf_sjd.reference.data import CLASS_NAMES, make_dataset
from hf_sjd.reference.vq import VQTokenizer

SEEDS = {"vq_data": 0, "heldout_data": 1, "ar_data": 2, "vq": 10, "classifier": 11, "ar": 12}
VQ_STEPS, VQ_BATCH, VQ_PER_CLASS = 450, 64, 500
CLS_STEPS, CLS_BATCH = 300, 64
AR_STEPS, AR_BATCH, AR_PER_CLASS = 650, 32, 1400
HELDOUT_PER_CLASS = 64
COND_DROPOUT = 0.1


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def psnr(reconstruction: torch.Tensor, images: torch.Tensor) -> float:
    """Mean per-image PSNR in dB for images in [-1, 1] (peak-to-peak 2)."""
    mse = (reconstruction - images).pow(2).flatten(1).mean(1)
    return float((10 * torch.log10(4.0 / mse)).mean())


def train_vq(images: torch.Tensor, heldout: torch.Tensor) -> tuple[VQTokenizer, dict]:
    torch.manual_seed(SEEDS["vq"])
    vq = VQTokenizer(channels=48)
    opt = torch.optim.AdamW(vq.parameters(), lr=2e-3, weight_decay=0.0)
    for step in tqdm(range(VQ_STEPS), desc="VQ tokenizer"):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, VQ_STEPS, 2e-3, 20)
        batch = images[torch.randint(0, len(images), (VQ_BATCH,))]
        recon, _, commitment = vq(batch)
        loss = F.mse_loss(recon, batch) + 0.1 * F.l1_loss(recon, batch) + 0.25 * commitment
        opt.zero_grad()
        loss.backward()
        opt.step()
    vq.eval()
    with torch.no_grad():
        codes = torch.cat([vq.encode(chunk) for chunk in heldout.split(256)])
        recon = torch.cat([vq.decode_to_tensor(c) for c in codes.split(256)])
    usage = codes.unique().numel() / vq.codebook_size
    return vq, {"heldout_psnr_db": round(psnr(recon, heldout), 2), "codebook_usage": round(usage, 4),
                "codebook_size": vq.codebook_size, "parameters": sum(p.numel() for p in vq.parameters()),
                "fingerprint": vq.fingerprint()}


def train_classifier(images: torch.Tensor, labels: torch.Tensor, heldout: torch.Tensor,
                     heldout_labels: torch.Tensor) -> tuple[ReferenceClassifier, dict]:
    torch.manual_seed(SEEDS["classifier"])
    clf = ReferenceClassifier(num_classes=len(CLASS_NAMES))
    opt = torch.optim.AdamW(clf.parameters(), lr=2e-3, weight_decay=1e-4)
    for step in tqdm(range(CLS_STEPS), desc="classifier"):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, CLS_STEPS, 2e-3, 10)
        idx = torch.randint(0, len(images), (CLS_BATCH,))
        loss = F.cross_entropy(clf(images[idx]), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    clf.eval()
    with torch.no_grad():
        accuracy = float((clf(heldout).argmax(-1) == heldout_labels).float().mean())
    return clf, {"heldout_accuracy": round(accuracy, 4), "parameters": sum(p.numel() for p in clf.parameters())}


def token_sequences(vq: VQTokenizer, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Images -> ``[N, 1 + 256]`` sequences ``[condition, codes...]``."""
    codes = torch.cat([vq.encode(chunk).flatten(1) for chunk in images.split(512)])
    return torch.cat([(CONDITION_OFFSET + labels)[:, None], codes], dim=1)


@torch.no_grad()
def ar_statistics(model, sequences: torch.Tensor) -> dict:
    """Validation loss plus entropy / top-1 statistics of the next-token distributions on image tokens."""
    losses, entropies, top1, top1_correct = [], [], [], []
    for chunk in sequences.split(64):
        logits = model(input_ids=chunk).logits[:, :-1].float()  # [b, 256, vocab]
        targets = chunk[:, 1:]
        logp = logits.log_softmax(-1)
        losses.append(F.nll_loss(logp.flatten(0, 1), targets.flatten(), reduction="none"))
        entropies.append(-(logp.exp() * logp).sum(-1).flatten())
        top1.append(logp.max(-1).values.exp().flatten())
        top1_correct.append((logp.argmax(-1) == targets).float().flatten())
    entropy = torch.cat(entropies)
    return {"val_loss": round(float(torch.cat(losses).mean()), 4),
            "mean_entropy_nats": round(float(entropy.mean()), 3),
            "median_entropy_nats": round(float(entropy.median()), 3),
            "mean_top1_prob": round(float(torch.cat(top1).mean()), 4),
            "top1_accuracy": round(float(torch.cat(top1_correct).mean()), 4)}


def train_ar(train_seqs: torch.Tensor, val_seqs: torch.Tensor):
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEEDS["ar"])
    model = LlamaForCausalLM(ar_config())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(SEEDS["ar"])
    progress = tqdm(range(AR_STEPS), desc="AR model")
    for step in progress:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, AR_STEPS, 3e-3, 40)
        batch = train_seqs[torch.randint(0, len(train_seqs), (AR_BATCH,), generator=generator)].clone()
        drop = torch.rand(AR_BATCH, generator=generator) < COND_DROPOUT
        batch[drop, 0] = NULL_CONDITION_ID
        loss = model(input_ids=batch, labels=batch).loss  # position 0 (condition) is never a target
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            progress.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    stats = ar_statistics(model, val_seqs)
    uncond = val_seqs.clone()
    uncond[:, 0] = NULL_CONDITION_ID
    stats["val_loss_unconditional"] = ar_statistics(model, uncond)["val_loss"]
    stats["parameters"] = sum(p.numel() for p in model.parameters())
    return model, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=weights_dir())
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()

    images, labels = make_dataset(VQ_PER_CLASS, seed=SEEDS["vq_data"])
    heldout, heldout_labels = make_dataset(HELDOUT_PER_CLASS, seed=SEEDS["heldout_data"])
    vq, vq_report = train_vq(images, heldout)
    print("VQ:", vq_report)
    clf, clf_report = train_classifier(images, labels, heldout, heldout_labels)
    print("classifier:", clf_report)
    ar_images, ar_labels = make_dataset(AR_PER_CLASS, seed=SEEDS["ar_data"])
    train_seqs = token_sequences(vq, ar_images, ar_labels)
    val_seqs = token_sequences(vq, heldout, heldout_labels)
    model, ar_report = train_ar(train_seqs, val_seqs)
    print("AR:", ar_report)

    report = {
        "data": {"source": "skimage.data photos, random crops (scale 0.2-0.9 of the short side) + flips",
                 "classes": list(CLASS_NAMES), "image_size": 64, "vq_train_images": len(images),
                 "ar_train_sequences": len(train_seqs), "heldout_images": len(heldout), "seeds": SEEDS},
        "vq": vq_report, "classifier": clf_report,
        "ar": {**ar_report, "steps": AR_STEPS, "batch_size": AR_BATCH, "condition_dropout": COND_DROPOUT,
               "tokens_seen": AR_STEPS * AR_BATCH * NUM_IMAGE_TOKENS},
        "train_seconds": round(time.time() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".weights-", dir=args.out.parent))
    # The checkpoint describes what hf_sjd needs: its VQ tokenizer's fingerprint, its default SJD-PV library
    # (built afterwards by scripts/build_phrase_library.py --dataset reference), and image-only sampling.
    model.config.vq_fingerprint = vq.fingerprint()
    model.config.phrase_library = "phrases"  # the subfolder ar/phrases/: it travels with the model folder / repo
    model.generation_config.suppress_tokens = list(range(NUM_CODES, VOCAB_SIZE))
    model.to(torch.float16).save_pretrained(tmp / "ar")
    vq.to(torch.float16).save_pretrained(tmp / "vq")
    clf.save_pretrained(tmp / "classifier")  # tiny; fp32 keeps BatchNorm statistics exact
    (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.out.exists():
        shutil.rmtree(args.out)
    tmp.rename(args.out)
    print(f"wrote {args.out} in {report['train_seconds']} s")


if __name__ == "__main__":
    main()
