"""unwrap_model finds the module inside DDP-style, DataParallel and compiled wrappers."""

from __future__ import annotations

import torch
from torch import nn

from convergent.models import unwrap_model


def test_plain_modules_come_back_unchanged():
    model = nn.Linear(2, 2)
    assert unwrap_model(model) is model


def test_data_parallel_and_compiled_wrappers_are_removed_even_nested():
    model = nn.Linear(2, 2)
    assert unwrap_model(nn.DataParallel(model)) is model
    compiled = torch.compile(model)  # lazy: nothing is compiled until it is called
    assert compiled is not model and unwrap_model(compiled) is model
    assert unwrap_model(nn.DataParallel(torch.compile(model))) is model


def test_a_module_attribute_alone_is_not_a_wrapper():
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)  # a submodule that happens to be called "module"

    holder = Holder()
    assert unwrap_model(holder) is holder
