"""Loss and score functions shared by the training loop, the pillars and the studies.

- `tasks`: the loss and scores of each task (``"classification"``, ``"regression"``,
  ``"lm"``), next-token labels, and the per-layer losses through a shared readout;
- `chunked_cross_entropy`: cross-entropy through a linear head without the
  ``[tokens x vocab]`` logit tensor;
- `readout`: the per-layer losses of a Hugging Face model read through its own head.
"""

from convergent.losses.chunked_cross_entropy import chunked_linear_cross_entropy
from convergent.losses.readout import layerwise_readout_losses, sequence_classification_readout
from convergent.losses.tasks import (
    IGNORE_INDEX,
    SCORE_KEYS,
    TASKS,
    check_task,
    losses_from_hidden_states,
    next_token_labels,
    summarize_scores,
    task_loss,
    task_scores,
)

__all__ = [
    "IGNORE_INDEX",
    "SCORE_KEYS",
    "TASKS",
    "check_task",
    "chunked_linear_cross_entropy",
    "layerwise_readout_losses",
    "losses_from_hidden_states",
    "next_token_labels",
    "sequence_classification_readout",
    "summarize_scores",
    "task_loss",
    "task_scores",
]
