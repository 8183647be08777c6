"""The primal-dual training step: descent constraints on a model's per-layer losses.

Per step: one forward pass with every hidden state, per-layer losses through the model's
one shared ``readout`` (f_L from the model's own logits), the slacks
s_l = f_l - (1 - alpha_l) f_{l-1}, and the Lagrangian f_L + sum_l lambda_l (s_l - u_l) that
the loop differentiates. After the primal optimizer step, the dual variables move on the
cadence's slack estimate, all-reduced over processes so that lambda and u stay identical on
every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from convergent.acting import RunShape, register_check
from convergent.constrained import (
    DescentCheck,
    DescentConstraints,
    DualAscent,
    DualCadence,
    PrimalDualResult,
    SlackAverage,
    check_token_fraction,
    dual_metrics,
    inverse_probability_losses,
    lagrangian,
    sample_layers,
    sample_tokens,
)
from convergent.losses import (
    IGNORE_INDEX,
    check_task,
    chunked_linear_cross_entropy,
    losses_from_hidden_states,
    task_loss,
)
from convergent.models import unwrap_model
from convergent.train import distributed
from convergent.train.batches import take, trim_padding
from convergent.train.steps import split_batch


def _inner(model: nn.Module) -> Any:
    return unwrap_model(model)


def _linear_head(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """(final_norm, head) of a model whose readout is head(final_norm(h)) per token."""
    inner = _inner(model)
    norm, head = getattr(inner, "final_norm", None), getattr(inner, "head", None)
    if not isinstance(norm, nn.Module) or not isinstance(head, nn.Linear):
        raise ValueError(
            f"logit_chunk_tokens needs a model whose readout is head(final_norm(h)) with a "
            f"linear head; {type(inner).__name__} has none"
        )
    return norm, head


class PrimalDualStep:
    """A :class:`~convergent.train.steps.TrainingStep` for descent-constrained training.

    Args:
        task: ``"classification"``, ``"regression"`` or ``"lm"``.
        constraints: the L descent constraints.
        dual: the multipliers (and resilient slacks) with their optimizer.
        cadence: when the dual step runs (every step by default).
        full_pass_data: the dataset measured once per epoch for cadence ``"epoch"``.
        full_pass_batch_size: batch size of that measurement.
        layers_per_step: read out only this many of the layers 0..L-1 per step (plus L) and
            use the unbiased inverse-probability estimate; None reads out all of them.
        token_fraction: task "lm" only: read out the layers 0..L-1 at this share of the
            target tokens, drawn afresh each step (the same tokens for every layer), for an
            unbiased estimate of their losses (`convergent.constrained.sample_tokens`); the
            last layer stays exact. None reads out every token.
        logit_chunk_tokens: task "lm" with a model whose readout is ``head(final_norm(h))``
            (`convergent.models.Transformer`): the inner layers' losses by
            `convergent.losses.chunked_cross_entropy`, never holding more than this many tokens'
            logits at once; None computes each layer's logits whole.
        seed: seeds the layer draws (identical on every process).
        readout: the shared head ``readout(hidden_state, attention_mask)``; the model's own
            ``readout`` by default.
    """

    def __init__(
        self,
        task: str,
        constraints: DescentConstraints,
        dual: DualAscent,
        cadence: DualCadence | None = None,
        *,
        full_pass_data: Dataset[Any] | None = None,
        full_pass_batch_size: int = 256,
        layers_per_step: int | None = None,
        token_fraction: float | None = None,
        logit_chunk_tokens: int | None = None,
        seed: int = 0,
        readout: Callable[..., torch.Tensor] | None = None,
    ) -> None:
        self.task = check_task(task)
        if logit_chunk_tokens is not None and (self.task != "lm" or logit_chunk_tokens < 1):
            raise ValueError(
                f"logit_chunk_tokens is {logit_chunk_tokens} for task {task!r}; it must be "
                ">= 1, for task 'lm'"
            )
        self.logit_chunk_tokens = logit_chunk_tokens
        if token_fraction is not None:
            if self.task != "lm":
                raise ValueError(
                    f"token_fraction is {token_fraction} for task {task!r}; it applies to task "
                    "'lm' only (pooled heads mix every token)"
                )
            check_token_fraction(token_fraction)
        self.token_fraction = token_fraction
        if dual.num_constraints != constraints.num_constraints:
            raise ValueError(
                f"{dual.num_constraints} multipliers for {constraints.num_constraints} "
                "constraints; they must match"
            )
        self.constraints = constraints
        self.dual = dual
        self.cadence = cadence or DualCadence()
        if self.cadence.mode == "epoch" and full_pass_data is None:
            raise ValueError("cadence 'epoch' needs full_pass_data to measure the slacks on")
        self.full_pass_data = full_pass_data
        self.full_pass_batch_size = full_pass_batch_size
        num_layers = constraints.num_constraints
        if layers_per_step is not None and not 1 <= layers_per_step <= num_layers:
            raise ValueError(
                f"layers_per_step is {layers_per_step}; it must be in [1, {num_layers}]"
            )
        self.layers_per_step = layers_per_step
        self.seed = seed
        self.readout = readout
        self.average = SlackAverage(num_layers)
        self.steps = 0
        self.draws = 0
        self.token_draws = 0
        self.last_result: PrimalDualResult | None = None

    @property
    def num_layers(self) -> int:
        return self.constraints.num_constraints

    def _to(self, device: torch.device) -> None:
        if self.constraints.alpha.device != device:
            self.constraints.to(device)
            self.dual.to(device)
            self.average.to(device)

    def _draw_layers(self) -> list[int] | None:
        if self.layers_per_step is None:
            return None
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.draws)
        self.draws += 1
        return sample_layers(self.num_layers, self.layers_per_step, generator)

    def layer_losses(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, list[int] | None, Any]:
        """Differentiable ``[f_0 .. f_L]`` (an unbiased estimate when layers are sampled),
        the layers read out (None: all), and the model's output."""
        inputs, labels = split_batch(batch)
        output = model(**inputs, output_hidden_states=True)
        if output.hidden_states is None:
            raise ValueError(f"{type(_inner(model)).__name__} returned no hidden states")
        if len(output.hidden_states) != self.num_layers + 1:
            raise ValueError(
                f"the model returned {len(output.hidden_states)} hidden states; the constraints "
                f"expect {self.num_layers + 1} (f_0 .. f_L)"
            )
        readout = self.readout or getattr(_inner(model), "readout", None)
        if readout is None:
            raise ValueError(
                f"{type(_inner(model)).__name__} has no readout; pass readout= to the step "
                "(e.g. sequence_classification_readout(model) for Hugging Face classifiers)"
            )
        drawn = self._draw_layers()
        inner_layers = list(range(self.num_layers)) if drawn is None else drawn[:-1]
        mask = inputs.get("attention_mask")
        if self.token_fraction is None and self.logit_chunk_tokens is None:
            inner = losses_from_hidden_states(
                readout, output.hidden_states, labels, self.task, mask, inner_layers
            )
        else:
            inner = self._token_losses(model, readout, output.hidden_states, labels, inner_layers)
        # f_L comes from the model's own logits: one readout fewer than reading out layer L.
        last = task_loss(output.logits, labels, self.task).reshape(1)
        losses = torch.cat([inner, last])
        if drawn is not None:
            losses = inverse_probability_losses(losses, drawn, self.num_layers, len(inner_layers))
        return losses, drawn, output

    def _token_losses(
        self,
        model: nn.Module,
        readout: Callable[..., torch.Tensor],
        hidden_states: Any,
        labels: torch.Tensor,
        layers: list[int],
    ) -> torch.Tensor:
        """Each layer's mean next-token loss over this step's sampled target tokens (all of
        them without ``token_fraction``), chunked through the head with ``logit_chunk_tokens``."""
        flat = labels.reshape(-1)
        if self.token_fraction is None:
            chosen = (flat != IGNORE_INDEX).nonzero().reshape(-1)
        else:
            # A stream apart from the layer draws' (seed * 1_000_003 + draws).
            stream = (self.seed * 1_000_003 + self.token_draws) ^ (0x5EED << 32)
            generator = torch.Generator().manual_seed(stream)
            self.token_draws += 1
            chosen = sample_tokens(labels, self.token_fraction, generator, IGNORE_INDEX)
        targets = flat[chosen]
        head = _linear_head(model) if self.logit_chunk_tokens is not None else None
        losses = []
        for layer in layers:
            hidden = hidden_states[layer]
            rows = hidden.reshape(-1, hidden.shape[-1])[chosen]  # [k, d]
            if head is None:
                losses.append(task_loss(readout(rows.unsqueeze(0), None), targets, "lm"))
            else:
                norm, linear = head
                assert self.logit_chunk_tokens is not None
                losses.append(
                    chunked_linear_cross_entropy(
                        norm(rows),
                        linear.weight,
                        linear.bias,
                        targets,
                        chunk_tokens=self.logit_chunk_tokens,
                        ignore_index=IGNORE_INDEX,
                    )
                )
        if not losses:
            return labels.new_zeros(0, dtype=torch.float32)
        return torch.stack(losses)

    def loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The Lagrangian on ``batch`` and its metrics (``loss`` is the objective f_L)."""
        value, metrics, _ = self.loss_and_output(model, batch)
        return value, metrics

    def loss_and_output(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float], Any]:
        """:meth:`loss`, plus the model's output (for trainers that also want logits)."""
        self._to(distributed.model_device(model))
        losses, drawn, output = self.layer_losses(model, batch)
        slacks = self.constraints(losses)
        value = lagrangian(losses[-1], slacks, self.dual.value(), self.dual.relaxation)
        if model.training and torch.is_grad_enabled():
            self.average.add(slacks)
        self.last_result = PrimalDualResult.from_tensors(
            losses, slacks, self.dual.value(), self.dual.slack(), value, drawn
        )
        metrics = self.last_result.metrics()
        metrics["loss"] = self.last_result.objective
        return value, metrics, output

    def after_optimizer_step(self, model: nn.Module) -> dict[str, float]:
        self.steps += 1
        if not self.cadence.is_due(self.steps):
            return {}
        if self.cadence.mode == "epoch":
            assert self.full_pass_data is not None
            estimate = self.full_pass_slacks(model, self.full_pass_data)
            self.average.reset()
        else:
            if float(self.average.count) == 0:
                return {}
            estimate = distributed.all_reduce_mean(self.average.mean())
            self.average.reset()
        self.dual.step(estimate)
        return dual_metrics(self.dual.value().tolist(), _list(self.dual.slack()))

    def full_pass_losses(self, model: nn.Module, dataset: Dataset[Any]) -> torch.Tensor:
        """Exact ``[f_0 .. f_L]`` over ``dataset`` (see :func:`dataset_layer_losses`)."""
        return dataset_layer_losses(
            model,
            dataset,
            self.task,
            self.full_pass_batch_size,
            readout=self.readout,
            num_layers=self.num_layers,
        )

    def full_pass_slacks(self, model: nn.Module, dataset: Dataset[Any]) -> torch.Tensor:
        """The slacks of :meth:`full_pass_losses`."""
        return self.constraints(self.full_pass_losses(model, dataset)).detach()

    def state_dict(self) -> dict[str, Any]:
        return {
            "constraints": self.constraints.state_dict(),
            "dual": self.dual.state_dict(),
            "average": self.average.state_dict(),
            "steps": self.steps,
            "draws": self.draws,
            "token_draws": self.token_draws,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.constraints.load_state_dict(state["constraints"])
        self.dual.load_state_dict(state["dual"])
        self.average.load_state_dict(state["average"])
        self.steps = int(state["steps"])
        self.draws = int(state["draws"])
        self.token_draws = int(state.get("token_draws", 0))


@torch.no_grad()
def dataset_layer_losses(
    model: nn.Module,
    dataset: Dataset[Any],
    task: str,
    batch_size: int = 256,
    readout: Callable[..., torch.Tensor] | None = None,
    num_layers: int | None = None,
) -> torch.Tensor:
    """Per-layer losses ``[f_0 .. f_L]`` over a whole dataset, in eval mode.

    Examples are split across processes and the sums all-reduced, so every rank gets the
    same exact mean (per example, or per token for ``"lm"``).

    Args:
        model: a convergent model (or a DDP wrapper of one).
        dataset: a map-style dataset of dict examples.
        task: the task of the losses.
        batch_size: examples per forward pass.
        readout: the shared head; the model's ``readout`` by default.
        num_layers: L; the model's ``num_layers`` by default (Hugging Face models have none).
    """
    inner = _inner(model)
    device = distributed.model_device(inner)
    readout = readout or inner.readout
    was_training = inner.training
    inner.eval()
    size = len(dataset)  # type: ignore[arg-type]
    rank, world = distributed.rank(), distributed.world_size()
    totals: torch.Tensor | None = None
    count = torch.zeros((), dtype=torch.float64, device=device)
    try:
        for start in range(rank * batch_size, size, batch_size * world):
            indices = torch.arange(start, min(start + batch_size, size))
            batch = {k: v.to(device) for k, v in trim_padding(take(dataset, indices)).items()}
            inputs, labels = split_batch(batch)
            output = inner(**inputs, output_hidden_states=True)
            losses = losses_from_hidden_states(
                readout, output.hidden_states, labels, task, inputs.get("attention_mask")
            )
            weight = (labels != IGNORE_INDEX).sum() if task == "lm" else labels.shape[0]
            totals = (
                losses.double() * weight if totals is None else totals + losses.double() * weight
            )
            count += weight
    finally:
        inner.train(was_training)
    if totals is None:  # this rank had no examples; it still takes part in the reductions
        layers = inner.num_layers if num_layers is None else num_layers
        totals = torch.zeros(layers + 1, dtype=torch.float64, device=device)
    totals = distributed.all_reduce_sum(totals)
    count = distributed.all_reduce_sum(count)
    return (totals / count.clamp(min=1.0)).float()


def _descent_checks(step: PrimalDualStep, run: RunShape) -> list[DescentCheck]:
    return [DescentCheck(step.num_layers, run.max_steps)]


register_check(PrimalDualStep, _descent_checks)


def _list(tensor: torch.Tensor | None) -> list[float] | None:
    return None if tensor is None else tensor.tolist()


def descent_step(
    task: str,
    num_layers: int,
    *,
    alpha: Any = 0.0,
    dual_lr: float = 0.01,
    resilient_cost: float | None = None,
    cadence: str = "step",
    interval: int = 1,
    detach_previous: bool = False,
    multiplier_init: float = 0.0,
    full_pass_data: Dataset[Any] | None = None,
    layers_per_step: int | None = None,
    token_fraction: float | None = None,
    logit_chunk_tokens: int | None = None,
    seed: int = 0,
    readout: Callable[..., torch.Tensor] | None = None,
) -> PrimalDualStep:
    """A :class:`PrimalDualStep` from plain arguments (SGD dual optimizer).

    Args:
        task: the task of the per-layer losses.
        num_layers: L (the model's ``num_layers``).
        alpha: a constant, L values or a callable ``alpha(l)``, each in [0, 1).
        dual_lr: eta_d >= 0.
        resilient_cost: c > 0 for resilient relaxation, None for hard constraints.
        cadence: ``"step"``, ``"every"`` (every ``interval`` steps) or ``"epoch"``
            (every ``interval`` = steps-per-epoch steps, on a full pass over ``full_pass_data``).
        interval: K for ``"every"``, the steps per epoch for ``"epoch"``.
        detach_previous: stop gradients through (1 - alpha_l) f_{l-1}.
        multiplier_init: initial lambda.
        full_pass_data: the dataset for cadence ``"epoch"``.
        layers_per_step: sample this many of the layers 0..L-1 per step (unbiased estimate).
        token_fraction: task "lm": read out the layers 0..L-1 at this share of the target
            tokens (unbiased estimate; the last layer stays exact).
        logit_chunk_tokens: task "lm": the inner layers' losses chunked through the head.
        seed: seeds the layer and token draws.
        readout: the shared head ``readout(hidden_state, attention_mask)``; the model's
            ``readout`` by default.
    """
    constraints = DescentConstraints(num_layers, alpha, detach_previous=detach_previous)
    dual = DualAscent(num_layers, dual_lr, init=multiplier_init, resilient_cost=resilient_cost)
    return PrimalDualStep(
        task,
        constraints,
        dual,
        DualCadence(cadence, interval if cadence != "step" else 1),
        full_pass_data=full_pass_data,
        layers_per_step=layers_per_step,
        token_fraction=token_fraction,
        logit_chunk_tokens=logit_chunk_tokens,
        seed=seed,
        readout=readout,
    )
