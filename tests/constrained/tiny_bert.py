"""A tiny BERT classifier, random token data and a descent step, shared by the HF tests."""

from __future__ import annotations

import torch

from convergent.train.primal_dual import PrimalDualStep, descent_step
from tests.conftest import TensorDataset, tiny_bert_config


def tiny_bert_descent(examples: int) -> tuple[torch.nn.Module, TensorDataset, PrimalDualStep]:
    """A 2-layer BERT without dropout, `examples` random sentences, an active descent step."""
    from transformers import BertForSequenceClassification

    from convergent.losses import sequence_classification_readout

    config = tiny_bert_config(num_labels=2, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        input_ids=torch.randint(0, 50, (examples, 8), generator=generator),
        attention_mask=torch.ones(examples, 8, dtype=torch.long),
        labels=torch.randint(0, 2, (examples,), generator=generator),
    )
    step = descent_step("classification", 2, alpha=0.5, dual_lr=1.0)
    step.readout = sequence_classification_readout(model)
    return model, data, step
