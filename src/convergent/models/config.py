"""`TransformerConfig`: every choice of the small Transformer, checked when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from convergent.models.readout import TASKS, Pooling, Task, check_task_and_pooling

Norm = Literal["pre", "post", "none"]
Activation = Literal["gelu", "relu"]

NORMS: tuple[str, ...] = ("pre", "post", "none")
ACTIVATIONS: tuple[str, ...] = ("gelu", "relu")


@dataclass(frozen=True)
class TransformerConfig:
    """The shape and behaviour of a `Transformer`.

    Each block computes, with residual coefficient `beta` in [0, 1]:
    norm="pre":  Y = beta * X + Attn(LN(X));  Z = beta * Y + FFN(LN(Y));  final LN in the readout
    norm="post": Y = LN(beta * X + Attn(X));  Z = LN(beta * Y + FFN(Y))
    norm="none": Y = beta * X + Attn(X);      Z = beta * Y + FFN(Y)

    Attributes:
        task: "classification" (logits `[B, num_outputs]`), "regression" (`[B, num_outputs]`,
            or `[B, T, num_outputs]` with pooling="token") or "lm" (`[B, T, vocab_size]`).
        num_outputs: classes or regression targets; ignored for "lm".
        vocab_size: number of token ids, for token inputs (`input_ids`).
        input_dim: feature size, for continuous inputs (`inputs` of shape `[B, T, input_dim]`);
            exactly one of `vocab_size` and `input_dim` is set.
        max_len: longest sequence; the size of the learned positional embedding.
        d_model: width of the residual stream.
        n_heads: attention heads; must divide `d_model`.
        n_layers: number of blocks L (the model returns L + 1 hidden states).
        d_ff: hidden width of the feed-forward network; `None` means `4 * d_model`.
        causal: True for a causal decoder, False for a bidirectional encoder.
        beta: residual coefficient in [0, 1]; 1 is the usual residual, 0 removes it.
        norm: LayerNorm placement, "pre", "post" or "none".
        pooling: "cls" (first token), "mean" (masked mean), "last" (last kept token) or
            "token" (per-token regression); ignored for "lm".
        tie_embeddings: share the "lm" output projection with the token embedding.
        dropout: probability for embedding, attention-weight and residual-branch dropout.
        activation: feed-forward nonlinearity, "gelu" or "relu".
        bias: whether the linear layers have biases (the "lm" output projection never has).
        init_std: standard deviation of the normal initialisation of weights and embeddings.
        layer_norm_eps: epsilon of every LayerNorm.
    """

    task: Task = "classification"
    num_outputs: int = 2
    vocab_size: int | None = None
    input_dim: int | None = None
    max_len: int = 128
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int | None = None
    causal: bool = False
    beta: float = 1.0
    norm: Norm = "pre"
    pooling: Pooling = "cls"
    tie_embeddings: bool = False
    dropout: float = 0.0
    activation: Activation = "gelu"
    bias: bool = True
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        check_task_and_pooling(self.task, self.pooling, allowed_tasks=TASKS)
        _check_inputs(self.vocab_size, self.input_dim, self.task, self.tie_embeddings)
        for name in ("max_len", "d_model", "n_heads", "n_layers", "num_outputs"):
            _check_positive_int(name, getattr(self, name))
        if self.d_ff is not None:
            _check_positive_int("d_ff", self.d_ff)
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                f"allowed values are the divisors of {self.d_model}."
            )
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta={self.beta} is out of range; allowed range is [0, 1].")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} is out of range; allowed range is [0, 1).")
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r} is not supported; allowed values are {NORMS}.")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation={self.activation!r} is not supported; allowed values are {ACTIVATIONS}."
            )
        if not self.init_std > 0:
            raise ValueError(f"init_std={self.init_std} is out of range; it must be > 0.")
        if not self.layer_norm_eps > 0:
            raise ValueError(
                f"layer_norm_eps={self.layer_norm_eps} is out of range; it must be > 0."
            )

    @property
    def feed_forward_dim(self) -> int:
        """The feed-forward hidden width: `d_ff`, or `4 * d_model` when `d_ff` is None."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def head_dim(self) -> int:
        """Width of one attention head, `d_model // n_heads`."""
        return self.d_model // self.n_heads


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is out of range; it must be an integer >= 1.")


def _check_inputs(
    vocab_size: int | None, input_dim: int | None, task: str, tie_embeddings: bool
) -> None:
    if (vocab_size is None) == (input_dim is None):
        raise ValueError(
            f"vocab_size={vocab_size!r} and input_dim={input_dim!r}: set exactly one "
            "(vocab_size for token inputs, input_dim for continuous inputs)."
        )
    if vocab_size is not None:
        _check_positive_int("vocab_size", vocab_size)
    if input_dim is not None:
        _check_positive_int("input_dim", input_dim)
    if task == "lm" and vocab_size is None:
        raise ValueError(
            f"task='lm' needs token inputs, but vocab_size=None (input_dim={input_dim}); "
            "set vocab_size >= 1."
        )
    if tie_embeddings and task != "lm":
        raise ValueError(
            f"tie_embeddings=True needs task='lm', got task={task!r}; set tie_embeddings=False."
        )
