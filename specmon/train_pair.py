"""Train specmon's default model pair: a small target and a much smaller draft sharing one tokenizer, on CPython's
own standard-library source (PSF License), from a fixed seed.

    python -m specmon.train_pair --out data/models

Nothing is downloaded: the corpus is the standard library of the Python running this script (the top-level .py
files of sysconfig's stdlib path, sorted by name), the tokenizer is a byte-level BPE trained on it, and the models
are plain GPT-2 architectures from transformers, saved as safetensors that `from_pretrained` loads offline.
"""
from __future__ import annotations

import argparse
import math
import os
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
VOCAB = 4096
CONTEXT = 256
SEED = 20261129
# The target has about 13x the draft's parameters (4.27M against 0.33M).
CONFIGS = {"target": dict(n_layer=4, n_embd=256, n_head=4), "draft": dict(n_layer=1, n_embd=64, n_head=2)}


def corpus(stdlib: str | None = None) -> str:
    """The top-level standard-library modules, sorted by name, separated by the end-of-text token."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    return f"\n{EOS}\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)


def train_tokenizer(text: str, vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS,
                                   model_max_length=CONTEXT)


def train_model(name: str, ids: torch.Tensor, eos_id: int, steps: int, batch: int = 16, seq: int = 128,
                lr: float = 2e-3, seed: int = SEED) -> GPT2LMHeadModel:
    """AdamW with warm-up and cosine decay on random windows of the token stream."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, bos_token_id=eos_id, eos_token_id=eos_id,
                        **CONFIGS[name])
    model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    warmup = max(1, steps // 20)
    start = time.time()
    for step in range(steps):
        scale = (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        offsets = torch.randint(0, len(ids) - seq - 1, (batch,), generator=gen)
        x = torch.stack([ids[o:o + seq] for o in offsets])
        loss = model(x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            print(f"{name} step {step + 1}/{steps} loss {loss.item():.3f} ({time.time() - start:.0f} s)", flush=True)
    model.eval()
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data" / "models"))
    ap.add_argument("--target-steps", type=int, default=1400)
    ap.add_argument("--draft-steps", type=int, default=1400)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    text = corpus()
    tokenizer = train_tokenizer(text)
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    print(f"corpus: {len(text) / 1e6:.1f} MB of CPython's standard library, {len(ids):,} tokens", flush=True)
    for name, steps in (("draft", args.draft_steps), ("target", args.target_steps)):
        model = train_model(name, ids, tokenizer.eos_token_id, steps)
        out = Path(args.out) / name
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters -> {out}", flush=True)


if __name__ == "__main__":
    main()
