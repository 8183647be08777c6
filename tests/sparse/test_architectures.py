"""One-shot pruning of the architectures users prune: tiny configs built from each config class.

Llama, Qwen2, Qwen3 and Mistral blocks take keyword arguments (rotary ``position_embeddings``,
grouped-query attention, RMSNorm, SwiGLU); OPT's decoder sits at ``model.decoder.layers``;
GPT-2 stores its ``Conv1D`` weights ``[in, out]``; BERT is an encoder with a pooler after its
blocks. Each is pruned by every method: every prunable matrix reaches its target (within one
weight per row), N:M holds, and the outputs stay finite.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from convergent.sparse import METHODS, MaskSpec, prune_one_shot
from convergent.sparse.calibration import find_blocks

VOCAB = 64
SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention
    "max_position_embeddings": 32,
}


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**SMALL))


def qwen2() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**SMALL))


def qwen3() -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8))


def mistral() -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**SMALL))


def opt() -> nn.Module:
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=32,
                       word_embed_proj_dim=32)  # fmt: skip
    return OPTForCausalLM(config)


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


def bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32)  # fmt: skip
    return BertForSequenceClassification(config)


# architecture -> (build, its block list, prunable matrices per block)
ARCHITECTURES = {
    "llama": (llama, "model.layers", 7),
    "qwen2": (qwen2, "model.layers", 7),
    "qwen3": (qwen3, "model.layers", 7),
    "mistral": (mistral, "model.layers", 7),
    "opt": (opt, "model.decoder.layers", 6),
    "gpt2": (gpt2, "transformer.h", 4),
    "bert": (bert, "bert.encoder.layer", 6),
}


def built(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return ARCHITECTURES[name][0]().eval()


def batches(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    result = []
    for rows, length in ((2, 12), (3, 10)):
        ids = torch.randint(0, VOCAB, (rows, length), generator=generator)
        mask = torch.ones(rows, length, dtype=torch.long)
        mask[0, -2:] = 0  # right padding in the first row
        result.append({"input_ids": ids, "attention_mask": mask})
    return result


def as_rows(model: nn.Module, name: str, weight: torch.Tensor) -> torch.Tensor:
    owner = model.get_submodule(name.rsplit(".", 1)[0])
    return weight.T if type(owner).__name__ == "Conv1D" else weight


def outputs(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**batches(1)[0]).logits


# SparseGPT (the method with the most machinery) on every architecture, the others on two.
CASES = [(name, "sparsegpt") for name in ARCHITECTURES] + [
    (name, method) for name in ("llama", "gpt2") for method in METHODS if method != "sparsegpt"
]


@pytest.mark.parametrize(("architecture", "method"), CASES)
def test_every_prunable_matrix_reaches_its_target_and_outputs_stay_finite(architecture, method):
    model = built(architecture)
    _, prefix, per_block = ARCHITECTURES[architecture]
    spec = MaskSpec()
    names = spec.select(model).names
    found = find_blocks(model, names)
    assert found is not None and found[0] == prefix
    inside = [name for name in names if name.startswith(f"{prefix}.")]
    assert len(inside) == 2 * per_block
    report = prune_one_shot(model, 0.7, spec=spec, method=method, calibration=batches(),
                            options={"block_size": 16} if method == "sparsegpt" else None)  # fmt: skip
    parameters = dict(model.named_parameters())
    assert [layer["name"] for layer in report.layers] == names
    for name in names:
        rows = as_rows(model, name, parameters[name].detach())
        out = rows.shape[0]
        zeros = int((rows == 0).sum())
        # within one weight per row of the target (SparseGPT's block threshold: plus one)
        assert abs(zeros - 0.7 * rows.numel()) <= out + 1, name
    assert torch.isfinite(outputs(model)).all()


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
@pytest.mark.parametrize("architecture", ["qwen3", "opt", "bert"])
def test_two_four_holds_along_every_layers_inputs(architecture, method):
    model = built(architecture)
    prune_one_shot(model, 0.5, spec=MaskSpec(pattern="2:4"), method=method,
                   calibration=batches())  # fmt: skip
    parameters = dict(model.named_parameters())
    for name in MaskSpec().select(model).names:
        rows = as_rows(model, name, parameters[name].detach())
        groups = (rows != 0).reshape(rows.shape[0], -1, 4).sum(dim=-1)
        assert int(groups.max()) <= 2, name
    assert torch.isfinite(outputs(model)).all()


def test_owl_allocates_per_block_on_a_llama():
    model = built("llama")
    spec = MaskSpec(distribution="owl", owl_m=3.0)
    report = prune_one_shot(model, 0.6, spec=spec, method="wanda", calibration=batches())
    values = list(report.block_sparsities.values())
    assert len(values) == 2 and math.isclose(sum(values) / 2, 0.6)
    assert math.isclose(max(values) - min(values), 2 * spec.owl_lmbda)


def test_bfloat16_weights_are_pruned_with_float64_statistics():
    """The statistics do not lose precision to the weights' dtype: the bf16 model gets the masks
    a float64 accumulation of its (bf16) layer inputs gives."""
    from tests.sparse.test_blockwise import block_stages, reference_prune

    model = built("llama").to(torch.bfloat16)
    reference = built("llama").to(torch.bfloat16)
    spec = MaskSpec()
    report = prune_one_shot(model, 0.5, spec=spec, method="wanda", calibration=batches())
    names = spec.select(reference).names
    masks = reference_prune(reference, block_stages(names, "model.layers", 2), batches(), 0.5,
                            "unstructured", "wanda")  # fmt: skip
    for name in names:
        assert torch.equal(report.masks[name], masks[name]), name
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
