"""The recipe's optimizers: which parameter each one updates and with what decay, and per-head
Muon, whose orthogonalisation must be torch's Muon applied to each head's matrix alone."""

import itertools

import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz

from headlab.model.config import preset
from headlab.model.gpt import GPT
from headlab.schema import FAMILIES
from headlab.training.config import TrainConfig, train_preset
from headlab.training.optimizers import HeadwiseMuon, Muon, is_lrkv_factor, make_optimizers, orthogonalize
from headlab.training.reads import train_setting_reaches

TINY = TrainConfig(steps=4, batch_size=2)


def routes(model, optimizers):
    """parameter name -> (optimizer class name, weight decay) for every parameter."""
    names = {id(p): n for n, p in model.named_parameters()}
    where = {}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                assert names[id(p)] not in where, f"{names[id(p)]} is stepped twice"
                where[names[id(p)]] = (type(optimizer).__name__, group["weight_decay"])
    assert set(where) == set(names.values())
    return where


def test_orthogonalize_is_torchs_muon_iteration_on_each_matrix():
    torch.manual_seed(0)
    for shape in ((3, 32, 8), (2, 8, 32)):
        stack = torch.randn(*shape)
        ours = orthogonalize(stack)
        for head in range(shape[0]):
            reference = _zeropower_via_newtonschulz(stack[head], (3.4445, -4.7750, 2.0315), 5, 1e-7).float()
            assert torch.allclose(ours[head], reference, atol=1e-3), head  # a reordered bf16 iteration differs by 2e-2
        singular = torch.linalg.svdvals(ours)
        assert singular.min() > 0.5 and singular.max() < 1.5


def test_headwise_muon_updates_each_head_from_its_own_gradient_alone():
    torch.manual_seed(1)
    start = torch.randn(4, 16, 4)
    gradient = torch.randn(4, 16, 4)
    updates = []
    for scale_of_head_3 in (1.0, 50.0):
        p = torch.nn.Parameter(start.clone())
        p.grad = gradient.clone()
        p.grad[3] *= scale_of_head_3
        HeadwiseMuon([p], lr=0.1, weight_decay=0.5).step()
        updates.append(p.detach() - start * (1 - 0.1 * 0.5))
    assert torch.equal(updates[0][:3], updates[1][:3])  # heads 0-2 never see head 3's gradient
    expected = -0.1 * (16 / 4) ** 0.5 * orthogonalize(gradient[:3] * (1 - 0.95 ** 2))  # Nesterov's first step
    assert torch.allclose(updates[0][:3], expected, atol=1e-5)
    with pytest.raises(ValueError, match="heads, m, n"):
        HeadwiseMuon([torch.nn.Parameter(torch.zeros(3, 3))], lr=0.1)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_lrkv_factors_lose_their_weight_decay_only_when_asked(optimizer):
    model = GPT(preset("tiny", "lrkv"))
    default = routes(model, make_optimizers(model, TINY.replace(optimizer=optimizer)))
    off = routes(model, make_optimizers(model, TINY.replace(optimizer=optimizer, lrkv_factor_decay=False)))
    factors = [n for n in default if is_lrkv_factor(n)]
    assert len(factors) == 4 * model.config.n_layer
    for name in default:
        if is_lrkv_factor(name):
            assert off[name] == (default[name][0], 0.0)
        else:
            assert off[name] == default[name], name
    expected_u = ("AdamW" if optimizer == "adamw" else "Muon", 0.1)
    assert all(default[n] == expected_u for n in factors if ".u_" in n)
    assert all(default[n] == ("AdamW", 0.1 if optimizer == "adamw" else 0.0) for n in factors if ".b_" in n)
    groups = [len(o.param_groups) for o in make_optimizers(model, TINY.replace(optimizer=optimizer))]
    assert groups == ([2] if optimizer == "adamw" else [1, 3])  # the default recipe's groups, so old runs resume


CHANGES = [("lrkv_factor_decay", False), ("lrkv_b_optimizer", "muon"), ("lr", 0.01), ("muon_qk", False),
           ("matrix_lr", 0.05), ("embedding_lr", 0.1)]


@pytest.mark.parametrize("optimizer,field,value", [("muon", *change) for change in CHANGES] + [
    ("adamw", *change) for change in CHANGES if change[0] not in ("lrkv_b_optimizer", "muon_qk")])  # Muon's alone
def test_a_training_field_changes_the_optimizers_of_exactly_the_families_it_is_said_to_reach(optimizer, field, value):
    """What a study trusts when it refuses a setting no trained role reads (`train_setting_reaches`,
    from the plan the optimizers are made from): the optimizers made under either value differ
    for exactly the families it is said to reach, under AdamW (where Muon's settings reach none)
    and under Muon, with headlab's norms and nanochat's parameter-free ones (lr then reaches LRKV's B_h alone)."""
    recipe = TINY.replace(optimizer=optimizer)
    changed = recipe.replace(**{field: value})
    for attention, arch in itertools.product(FAMILIES, ("headlab", "nanochat")):
        model = GPT(preset("tiny", attention, arch=arch))
        treated = [{name: (type(o).__name__, {k: v for k, v in g.items() if k != "params"})
                    for o in make_optimizers(model, config) for g in o.param_groups
                    for name, p in model.named_parameters() if any(p is q for q in g["params"])}
                   for config in (recipe, changed)]  # how each parameter is stepped (an empty group steps none)
        assert (treated[0] != treated[1]) == train_setting_reaches(field, model.config, recipe), (attention, arch)


def test_per_head_muon_on_b_takes_exactly_the_b_tensors():
    model = GPT(preset("tiny", "lrkv"))
    where = routes(model, make_optimizers(model, TINY.replace(optimizer="muon", lrkv_b_optimizer="muon")))
    assert {n for n, (kind, _) in where.items() if kind == "HeadwiseMuon"} == {
        n for n, p in model.named_parameters() if n.endswith((".b_k", ".b_v"))}
    assert all(decay == 0.1 for kind, decay in where.values() if kind == "HeadwiseMuon")
    with pytest.raises(ValueError, match="lrkv_b_optimizer"):
        TINY.replace(lrkv_b_optimizer="muon")  # AdamW's recipe has no Muon to put B_h in


def test_muon_batched_by_shape_is_the_per_matrix_update_and_torchs():
    """Two steps over matrices of three shapes (two of each, one without a gradient): stacking a
    shape's matrices into one Newton–Schulz call gives each matrix the update it gets alone
    (bit for bit) and torch.optim.Muon's (to bf16 rounding: its iteration is ordered otherwise)."""
    torch.manual_seed(2)
    shapes = [(16, 16), (32, 16), (16, 32), (16, 16), (32, 16), (16, 32), (8, 8)]
    start = [torch.randn(shape) for shape in shapes]
    gradients = [[torch.randn(shape) for shape in shapes] for _ in range(2)]

    def trained(make, alone=False):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        optimizers = [make([p]) for p in params] if alone else [make(params)]
        for step in gradients:
            for p, g in zip(params, step):
                p.grad = None if p.shape == (8, 8) else g.clone()
            for optimizer in optimizers:
                optimizer.step()
        return params

    def make(cls):
        return lambda params: cls(params, lr=0.05, weight_decay=0.1)

    batched, alone, torchs = trained(make(Muon)), trained(make(Muon), alone=True), trained(make(torch.optim.Muon))
    assert all(torch.equal(p, q) for p, q in zip(batched, alone))
    assert all(torch.allclose(p, q, atol=2e-3) for p, q in zip(batched, torchs))
    assert torch.equal(batched[-1], start[-1])  # no gradient: not touched, not even decayed
    assert not torch.allclose(batched[0], start[0], atol=1e-2)


@pytest.mark.parametrize("family", ["mha", "mqa", "lrkv", "mla"])
def test_muon_leaves_exactly_the_query_and_key_matrices_to_adamw_when_asked(family):
    model = GPT(preset("tiny", family))
    default = routes(model, make_optimizers(model, TINY.replace(optimizer="muon")))
    split = routes(model, make_optimizers(model, TINY.replace(optimizer="muon", muon_qk=False)))
    moved = {n for n in default if split[n] != default[n]}
    queries_keys = {"mha": ("c_q", "c_k"), "mqa": ("c_q", "c_k"), "lrkv": ("c_q", "k_shared", "u_k"),
                    "mla": ("wq",)}[family]
    assert moved == {f"blocks.{i}.attn.{m}.weight" for i in range(model.config.n_layer) for m in queries_keys}
    assert all(default[n] == ("Muon", 0.1) and split[n] == ("AdamW", 0.1) for n in moved)
    with pytest.raises(ValueError, match="muon_qk"):
        TINY.replace(muon_qk=False)  # AdamW's recipe has no Muon to take them from


def test_the_adamw_qk_preset_is_cpu_small_with_adamw_on_its_query_and_key_matrices():
    assert all(preset("cpu-small-adamw-qk", f) == preset("cpu-small", f) for f in ("mha", "mqa", "lrkv", "mla", "gqa"))
    assert train_preset("cpu-small-adamw-qk") == train_preset("cpu-small", muon_qk=False)
