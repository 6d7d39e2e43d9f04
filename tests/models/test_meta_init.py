"""meta_init: a meta-device build without torch's slow Python paths."""

from __future__ import annotations

import torch
from torch import nn

from embedcache.models.shared.meta_init import materialise, meta_device
from tests.fresh_python import fresh_python


def test_built_on_meta_then_given_cpu_storage_of_the_same_layout():
    with meta_device():
        module = nn.Sequential(nn.Embedding(7, 4, padding_idx=0), nn.Linear(4, 3))
        module.register_buffer("t", torch.empty(2, 5).t())  # not contiguous
    assert all(p.is_meta for p in module.parameters())
    before = {n: (t.shape, t.stride(), t.dtype) for n, t in module.state_dict().items()}
    materialise(module, device="cpu")
    after = {n: (t.shape, t.stride(), t.dtype) for n, t in module.state_dict().items()}
    assert after == before
    assert all(t.device.type == "cpu" for t in module.state_dict().values())


def test_only_meta_tensors_skip_normal():
    with meta_device():
        real = torch.zeros(1000, device="cpu")
        nn.init.normal_(real)
        meta = torch.empty(3)
        assert nn.init.normal_(meta) is meta
    assert real.std() > 0.5  # a CPU tensor is still drawn


def test_a_family_build_imports_neither_dynamo_nor_sympy():
    code = (
        "import sys, torch\n"
        "from torch import nn\n"
        "from embedcache.models.shared.checkpoint import empty_module\n"
        "empty_module(lambda: nn.Sequential(nn.Embedding(9, 4), nn.LayerNorm(4)))\n"
        "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n"
    )
    assert fresh_python(code) == "[]"
