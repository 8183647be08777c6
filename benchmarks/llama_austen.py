"""A small Llama-style character model trained on austen, saved with ``save_pretrained``: the
Llama model of ``llmcompressor_compare.py``.

Character-level, because the austen source is characters: an 81-symbol vocabulary keeps the
LM head negligible, so the training time (and the pruning the benchmark measures) goes to the
decoder blocks, which carry RMSNorm, rotary position embeddings, grouped-query attention and
SwiGLU as a real Llama's do. The folder holds a character tokenizer too (llm-compressor's
``oneshot`` refuses a dataset without a processor).

    python benchmarks/llama_austen.py --out runs/llmcompressor-compare/llama-austen
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from convergent.data import load_splits

CHARACTERS_PER_WINDOW = 128
# 4 blocks of d_model 128 (4 heads, 2 key-value heads), SwiGLU width 384: 0.20 M prunable
# weights per block. Small enough that 40 steps train in minutes on 2 cores shared with other
# jobs, and that every method and target prunes twice within the benchmark's 15 to 25 minutes;
# 40 steps take the character perplexity far below chance (81) though not to a plateau.
ARCHITECTURE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def character_tokenizer(itos: list[str]) -> PreTrainedTokenizerFast:
    """A tokenizer that maps each character to its austen id (one token per character)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocabulary = {character: index for index, character in enumerate(itos)}
    unknown = "\ufffd" if "\ufffd" in vocabulary else itos[0]
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(".|\n"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=unknown)


@torch.no_grad()
def validation_perplexity(model: LlamaForCausalLM, windows: torch.Tensor) -> float:
    model.eval()
    losses = [model(input_ids=batch, labels=batch).loss.item() for batch in windows.split(64)]
    model.train()
    return math.exp(sum(losses) / len(losses))


def train(out: Path, steps: int, batch_size: int = 8, learning_rate: float = 3e-3) -> dict:
    """Train the model for ``steps`` AdamW steps (warm-up, then cosine decay) on seeded
    random train windows; save it and its tokenizer to ``out``; return its record."""
    splits = load_splits("austen", seed=0, seq_len=CHARACTERS_PER_WINDOW)
    itos = splits.info["itos"]
    train_windows = splits.train.tensors["input_ids"]
    validation = splits.validation.tensors["input_ids"][:256]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(itos), max_position_embeddings=CHARACTERS_PER_WINDOW, **ARCHITECTURE
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    warmup = max(steps // 10, 1)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    generator = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    for step in range(steps):
        rows = torch.randint(len(train_windows), (batch_size,), generator=generator)
        batch = train_windows[rows]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step}: train loss {loss.item():.3f}", flush=True)
    record = {
        "steps": steps,
        "seconds": time.perf_counter() - started,
        "validation_perplexity": validation_perplexity(model, validation),
        "chance_perplexity": len(itos),
    }
    model.save_pretrained(out)
    character_tokenizer(itos).save_pretrained(out)
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/llmcompressor-compare/llama"))
    parser.add_argument("--steps", type=int, default=40)
    arguments = parser.parse_args()
    print(json.dumps(train(arguments.out, arguments.steps)))


if __name__ == "__main__":
    main()
