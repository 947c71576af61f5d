"""The hand-written backward passes of headlab.model.ops against autograd of the plain formulas."""

import pytest
import torch
import torch.nn.functional as F

from headlab.model.attention import common, mla
from headlab.model.ops import RMSNorm, relu_squared, rms_norm, rotate_and_normalize, rotate_pairs
from shared_fixtures import tiny_model


def _values_and_grads(fn, inputs, grad_out):
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*leaves)
    out.backward(grad_out)
    return out.detach(), [x.grad for x in leaves if x.requires_grad]


def _assert_same_as_autograd(fast, plain, inputs, atol=1e-12):
    generator = torch.Generator().manual_seed(1)
    out = plain(*inputs)
    grad_out = torch.randn(out.shape, generator=generator, dtype=out.dtype)
    fast_out, fast_grads = _values_and_grads(fast, inputs, grad_out)
    plain_out, plain_grads = _values_and_grads(plain, inputs, grad_out)
    torch.testing.assert_close(fast_out, plain_out, atol=atol, rtol=0)
    assert len(fast_grads) == len(plain_grads) > 0
    for a, b in zip(fast_grads, plain_grads):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def _randn(*shape, requires_grad=True, seed=0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.requires_grad_(requires_grad)


@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("shape", [(7,), (3, 5, 8), (2, 4, 3, 6)])
def test_rms_norm_matches_autograd_of_its_formula(shape, with_weight):
    def plain(x, *weight):
        y = x / (x.square().mean(-1, keepdim=True) + 1e-6).sqrt()
        return y * weight[0] if weight else y

    inputs = [_randn(*shape)] + ([_randn(shape[-1], seed=1)] if with_weight else [])
    _assert_same_as_autograd(lambda x, *w: rms_norm(x, w[0] if w else None, 1e-6), plain, inputs)


def test_rms_norm_on_a_strided_view_and_its_gradcheck():
    base = _randn(4, 3, 10, requires_grad=False)
    x = base[..., 2:8].detach().requires_grad_()  # a split view, as MLA's latent is
    weight = _randn(6, seed=2)
    assert not x.is_contiguous()
    _assert_same_as_autograd(lambda x, w: rms_norm(x, w, 1e-5),
                             lambda x, w: F.rms_norm(x, (6,), w, 1e-5), [x, weight])
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, 1e-5), (x, weight))


def test_rms_norm_module_is_a_drop_in_for_torchs():
    torch.manual_seed(0)
    ours, torchs = RMSNorm(12, eps=1e-6).double(), torch.nn.RMSNorm(12, eps=1e-6).double()
    with torch.no_grad():
        ours.weight.normal_()
        torchs.weight.copy_(ours.weight)
    assert list(ours.state_dict()) == list(torchs.state_dict()) == ["weight"]
    x = _randn(5, 12)
    _assert_same_as_autograd(ours, torchs, [x])
    default_eps = RMSNorm(12).float()  # eps None: the dtype's machine epsilon, as torch's
    x32 = torch.randn(3, 12) * 1e-4
    torch.testing.assert_close(default_eps(x32), torch.nn.RMSNorm(12).float()(x32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_keeps_the_input_dtype_and_takes_statistics_in_float32(dtype):
    """Half precision in, out and in the gradients, with values and gradients within rounding of
    the float32 computation, through headlab's backward (requires_grad) and torch's kernel. The
    inputs' squares (~10⁵) overflow float16, so statistics taken in float16 would fail."""
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 300).to(dtype)
    weight = torch.rand(64, generator=torch.Generator().manual_seed(1)) + 0.5
    grad = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    wide_x = x.float().requires_grad_()
    reference = wide_x / (wide_x.square().mean(-1, keepdim=True) + 1e-6).sqrt() * weight  # autograd of the formula
    reference.backward(grad)
    for needs_grad in (True, False):
        leaf = x.clone().requires_grad_(needs_grad)
        y = rms_norm(leaf, weight, 1e-6)
        assert y.dtype == dtype and (y.grad_fn is not None) == needs_grad
        torch.testing.assert_close(y.float(), reference.detach(), atol=0.02, rtol=0.01)
    leaf = x.clone().requires_grad_()
    y = rms_norm(leaf, weight, 1e-6)
    assert type(y.grad_fn).__name__ == "_RMSNormBackward"  # headlab's Function, not torch's
    y.backward(grad.to(dtype))
    assert leaf.grad.dtype == dtype
    torch.testing.assert_close(leaf.grad.float(), wide_x.grad, atol=1e-3, rtol=0.02)


def _plain_rotation(x, cos, sin):
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _angles(t, half, seed=3):
    theta = torch.rand(t, 1, half, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 6.3
    return theta.cos(), theta.sin()


def test_rotate_pairs_matches_autograd_of_the_rope_formula():
    cos, sin = _angles(5, 4)
    _assert_same_as_autograd(lambda x: rotate_pairs(x, cos, sin), lambda x: _plain_rotation(x, cos, sin),
                             [_randn(3, 5, 2, 8)])


def test_rotate_pairs_on_a_strided_view_preserves_norms_and_inverts():
    cos, sin = _angles(5, 3)
    x = _randn(2, 5, 4, 10, requires_grad=False)[..., 4:]  # MLA's RoPE part is such a view
    y = rotate_pairs(x, cos, sin)
    torch.testing.assert_close(y, _plain_rotation(x, cos, sin), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(rotate_pairs(y, cos, -sin), x, atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(lambda x: rotate_pairs(x, cos, sin), (x.detach().requires_grad_(),))


def test_rotate_and_normalize_is_rope_then_qk_norm():
    cos, sin = _angles(5, 4)
    x = _randn(3, 5, 2, 8)
    _assert_same_as_autograd(lambda x: rotate_and_normalize(x, cos, sin, 1e-3),
                             lambda x: F.rms_norm(_plain_rotation(x, cos, sin), (8,), eps=1e-3), [x])
    strided = _randn(2, 5, 3, 12, requires_grad=False)[..., 4:].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: rotate_and_normalize(x, cos, sin, 1e-3), (strided,))


def test_relu_squared_matches_autograd_of_its_formula():
    x = _randn(4, 9)
    _assert_same_as_autograd(relu_squared, lambda x: F.relu(x).square(), [x])
    assert torch.autograd.gradcheck(relu_squared, (x.detach().requires_grad_(),))


def test_backward_passes_refuse_double_backward():
    x = _randn(3, 4)
    (grad,) = torch.autograd.grad(relu_squared(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad|double backward"):
        torch.autograd.grad(grad.sum(), x)


@pytest.mark.parametrize("attention", ["mha", "gqa", "lrkv", "mla"])
def test_models_built_on_these_ops_train_under_bf16_autocast(attention):
    """bf16 activations meet float32 gains and RoPE tables: loss and gradients stay close to float32."""
    model = tiny_model(attention)
    idx = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))

    def loss_and_gradient(autocast):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(idx, idx)[1]
        loss.backward()
        return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])

    loss32, grad32 = loss_and_gradient(False)
    loss16, grad16 = loss_and_gradient(True)
    assert abs(loss16 - loss32) < 0.02 * loss32
    assert torch.isfinite(grad16).all()
    assert F.cosine_similarity(grad16, grad32, dim=0) > 0.99


def test_without_autograd_the_fast_path_gives_the_same_values():
    cos, sin = _angles(5, 4)
    x, weight, wide = _randn(3, 5, 2, 8), _randn(8, seed=1), _randn(3, 5, 2, 8, seed=2) * 4
    for op in (lambda: rms_norm(x, weight, 1e-6), lambda: rms_norm(x, None, 1e-6), lambda: relu_squared(wide),
               lambda: rotate_pairs(x, cos, sin), lambda: rotate_and_normalize(x, cos, sin, 1e-6)):
        tracked = op()
        with torch.no_grad():
            untracked = op()
        assert tracked.grad_fn is not None and untracked.grad_fn is None
        torch.testing.assert_close(untracked, tracked.detach(), atol=1e-12, rtol=0)


def test_torch_compile_traces_the_ops_in_one_graph_with_eager_gradients():
    """`compile=True` (GPU) must not fall back around the custom Functions; aot_eager runs the same
    tracing and autograd lowering as inductor, without a C++/Triton build."""
    model = tiny_model("lrkv").train()
    idx = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    assert torch._dynamo.explain(model)(idx, idx).graph_break_count == 0

    def loss_and_gradients(module):
        model.zero_grad(set_to_none=True)
        loss = module(idx, idx)[1]
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    eager_loss, eager_grads = loss_and_gradients(model)
    compiled_loss, compiled_grads = loss_and_gradients(torch.compile(model, backend="aot_eager"))
    torch.testing.assert_close(compiled_loss, eager_loss)
    for compiled, eager in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(compiled, eager)
    torch._dynamo.reset()


@pytest.mark.parametrize("op", ["rms_norm", "rms_norm without weight", "rotate_pairs", "rotate_and_normalize",
                                "relu_squared"])
def test_each_op_compiled_has_its_eager_gradient_in_float32(op):
    """Each Function alone under aot_eager, in float32, where a dtype cast is a no-op: torch 2.11's AOT
    autograd got the gradient wrong when the tensor a Function saves and returns is an alias of an
    intermediate (a no-op `.to`, an in-place result), which rms_norm without weight and
    rotate_and_normalize had."""
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(2, 3, 5, 8, generator=generator), torch.randn(8, generator=generator)
    cos, sin = torch.randn(5, 4, generator=generator), torch.randn(5, 4, generator=generator)
    apply = {"rms_norm": lambda x: rms_norm(x, weight, 1e-6),
             "rms_norm without weight": lambda x: rms_norm(x, None, 1e-6),
             "rotate_pairs": lambda x: rotate_pairs(x, cos, sin),
             "rotate_and_normalize": lambda x: rotate_and_normalize(x, cos, sin, 1e-6),
             "relu_squared": relu_squared}[op]
    upstream = torch.randn(x.shape, generator=generator)

    def gradient(function):
        leaf = x.clone().requires_grad_()
        (function(leaf) * upstream).sum().backward()
        return leaf.grad

    torch.testing.assert_close(gradient(torch.compile(apply, backend="aot_eager")), gradient(apply))


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_qk_norm_uses_one_epsilon_in_every_dtype(attention, monkeypatch):
    """QK-norm's ε is float32's in float32 and under bf16 autocast alike (bf16's own 2⁻⁷ would
    be another normalisation than the one analysis assumes)."""
    seen = set()

    def recording(function):
        def record(*args):
            seen.add(args[-1])
            return function(*args)
        return record

    monkeypatch.setattr(common, "rotate_and_normalize", recording(common.rotate_and_normalize))
    monkeypatch.setattr(mla, "rms_norm", recording(mla.rms_norm))
    model = tiny_model(attention, qk_norm=True)
    tokens = torch.randint(model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(tokens)
    assert seen == {torch.finfo(torch.float32).eps}
