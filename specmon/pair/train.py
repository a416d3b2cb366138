"""Train specmon's default model pair: a small target and a much smaller draft sharing one tokenizer, on CPython's
own standard-library source (PSF License), from a fixed seed.

    python -m specmon.pair.train --out specmon/data/models

The defaults are the recipe of the shipped weights (19,000 target and 24,000 draft steps of 64 x 256 tokens): about
6 minutes on one H200 GPU with the two models trained side by side (`--models target` and `--models draft` in two
processes), about 55 hours on 2 CPU cores (9.0 s per target step, 1.1 s per draft step).

Nothing is downloaded: the corpus is the standard library of the Python running this script (or of `--stdlib DIR`):
every .py file under it, sorted by path, without test suites, site-packages, idlelib and lib2to3. The tokenizer is a
byte-level BPE trained on it, and the models are plain GPT-2 architectures from transformers, saved as safetensors
that `from_pretrained` loads offline.

A quarter of each batch is "copy" windows: a few whole lines of the corpus repeated with blank lines between them, the
shape of the shipped copy-heavy prompts. Natural code repeats too little for models this small to learn to copy in
a short run; these windows teach both models to continue a repetition (an induction head needs two layers, so the
draft has two).
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

from specmon.core.resources import MODELS

EOS = "<|endoftext|>"
VOCAB = 4096
CONTEXT = 256
SEED = 20261129
WARMUP = 200
COPY_FRACTION = 0.25
COPY_POOL = 20_000
COPY_SEPARATOR = "\n\n"  # after a block's own final newline: two blank lines, as in specmon/data/prompts/copy.jsonl
SKIPPED_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3"}
# The target has about 11x the draft's parameters (4.27M against 0.38M).
CONFIGS = {"target": dict(n_layer=4, n_embd=256, n_head=4), "draft": dict(n_layer=2, n_embd=64, n_head=2)}


def corpus_files(stdlib: str | None = None) -> list[Path]:
    """The standard library's modules, sorted by path, without SKIPPED_DIRS."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if p.is_file() and not SKIPPED_DIRS.intersection(p.relative_to(root).parts))


def corpus(files: list[Path]) -> str:
    """The files' text, separated by the end-of-text token."""
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


def copy_windows(text: str, tokenizer: PreTrainedTokenizerFast, count: int, seq: int, seed: int) -> torch.Tensor:
    """`count` windows of `seq` tokens, each a block of 2-10 whole non-blank lines repeated with blank lines between."""
    gen = torch.Generator().manual_seed(seed)
    lines = [line + "\n" for line in text.split("\n") if line.strip() and EOS not in line]
    starts = torch.randint(0, len(lines) - 10, (count,), generator=gen).tolist()
    sizes = torch.randint(2, 11, (count,), generator=gen).tolist()
    texts = []
    for start, size in zip(starts, sizes, strict=True):
        block = "".join(lines[start:start + size]) + COPY_SEPARATOR
        texts.append(block * (seq // max(1, len(block) // 8) + 2))  # seq tokens at up to 8 characters a token
    ids = tokenizer(texts, truncation=True, max_length=seq)["input_ids"]
    return torch.tensor([row for row in ids if len(row) == seq], dtype=torch.long)  # rows of longer tokens are dropped


def natural_windows(ids: torch.Tensor, count: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    offsets = torch.randint(0, len(ids) - seq - 1, (count,), generator=gen)
    return ids[(offsets[:, None] + torch.arange(seq)).to(ids.device)]


def batches(ids: torch.Tensor, copies: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """Random windows of the token stream, with COPY_FRACTION of the rows drawn from the copy windows."""
    n_copy = round(batch * COPY_FRACTION)
    picked = copies[torch.randint(0, len(copies), (n_copy,), generator=gen).to(copies.device)]
    return torch.cat([natural_windows(ids, batch - n_copy, seq, gen), picked])


def train_model(name: str, ids: torch.Tensor, copies: torch.Tensor, eos_id: int, steps: int, batch: int,
                seq: int = CONTEXT, lr: float = 2e-3, seed: int = SEED, device: str = "cpu") -> GPT2LMHeadModel:
    """AdamW with warm-up and cosine decay; bfloat16 autocast on a GPU."""
    torch.manual_seed(seed)
    shape = CONFIGS[name]
    config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, bos_token_id=eos_id, eos_token_id=eos_id,
                        n_layer=shape["n_layer"], n_embd=shape["n_embd"], n_head=shape["n_head"])
    model = GPT2LMHeadModel(config).to(device)  # type: ignore[arg-type]  # transformers' to() stub drops self
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    ids, copies = ids.to(device), copies.to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))
    warmup = min(WARMUP, steps // 2)
    start = time.time()
    for step in range(steps):
        scale = (step + 1) / warmup if step < warmup else \
            0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        x = batches(ids, copies, batch, seq, gen)
        with autocast:
            loss = model(x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 500 == 0 or step + 1 == steps:
            print(f"{name} step {step + 1}/{steps} loss {loss.item():.3f} ({time.time() - start:.0f} s)", flush=True)
    model.eval()
    return model


@torch.no_grad()
def greedy_accuracy(model: GPT2LMHeadModel, windows: torch.Tensor, skip: int = 0) -> float:
    """How often the model's argmax is the next token, past the first `skip` positions of each window."""
    x = windows.to(next(model.parameters()).device)
    return (model(x).logits[:, skip:-1].argmax(-1) == x[:, skip + 1:]).float().mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(MODELS), help="where to write the pair (default: the shipped pair's folder)")
    ap.add_argument("--stdlib", help="the standard library to train on (default: this Python's)")
    ap.add_argument("--models", nargs="+", choices=sorted(CONFIGS), default=["draft", "target"])
    ap.add_argument("--target-steps", type=int, default=19_000)
    ap.add_argument("--draft-steps", type=int, default=24_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    files = corpus_files(args.stdlib)
    if not files:
        ap.error(f"--stdlib {args.stdlib}: no .py modules there to train on")
    text = corpus(files)
    tokenizer = train_tokenizer(text)
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    copies = copy_windows(text, tokenizer, COPY_POOL, CONTEXT, SEED)
    held_out = copy_windows(text, tokenizer, 512, CONTEXT, SEED + 1)
    print(f"corpus: {len(files)} modules of CPython's standard library, {len(text) / 1e6:.1f} MB, "
          f"{len(ids):,} tokens; {len(copies):,} copy windows", flush=True)
    for name in args.models:
        model = train_model(name, ids, copies, tokenizer.eos_token_id, getattr(args, f"{name}_steps"), args.batch,
                            device=args.device)
        natural = greedy_accuracy(model, natural_windows(ids, 256, CONTEXT, torch.Generator().manual_seed(SEED + 1)))
        repeated = greedy_accuracy(model, held_out, skip=CONTEXT // 2)
        model = model.to("cpu")  # type: ignore[arg-type]  # transformers' to() stub drops self
        out = Path(args.out) / name
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters -> {out}; greedy accuracy "
              f"{natural:.3f} on the corpus, {repeated:.3f} on the second half of held-out copy windows", flush=True)


if __name__ == "__main__":
    main()
