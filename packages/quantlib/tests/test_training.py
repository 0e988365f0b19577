"""QAT (straight-through gradients, loss-free conversion to PTQ) and QLoRA (frozen base)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxstack import nnlib
from jaxstack import quantlib as ql

INT4 = (ql.QuantRule(".*", "int4", tile_size=64, act_qtype="int8"),)


def loss_fn(apply, batch):
    def loss(params):
        logits = apply(params, batch["tokens"], batch["positions"], batch["segment_ids"])[0]
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()

    return loss


def test_qat_gradients_are_the_float_gradients_at_the_quantised_point(model, batch):
    """Straight-through: the QAT model's gradient is the float model's gradient evaluated at
    the fake-quantised weights (the rounding is skipped in the backward pass)."""
    weight_only = (ql.QuantRule(".*", "int4", tile_size=64),)
    apply, params = nnlib.as_function(ql.quantize(model, ql.QatProvider(weight_only)))
    grads = jax.grad(loss_fn(apply, batch))(params)
    snapped = nnx.clone(model)
    for _, module in nnlib.iter_modules(snapped):
        if isinstance(module, nnlib.Dense):
            module.kernel[...] = ql.fake_quantize(
                module.kernel[...], "int4", tile_size=64, contract_ndim=len(module.in_features)
            )
    apply_f, params_f = nnlib.as_function(snapped)
    grads_f = jax.grad(loss_fn(apply_f, batch))(params_f)
    for g, gf in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_f), strict=True):
        np.testing.assert_allclose(g, gf, rtol=1e-3, atol=1e-5 * float(jnp.abs(gf).max()))


def test_qat_fake_quantisation_under_jit_is_bit_exact_with_the_stored_ptq_weights(model):
    """What QAT trains against (fake quantisation, jitted as in a train step) is exactly what
    PTQ stores: same tiles, same scales, same codes, so conversion loses nothing."""
    ptq = ql.quantize(model, ql.PtqProvider([ql.QuantRule(".*", "int4", tile_size=64)]))
    stored = {p: m.kernel.get_value() for p, m in nnlib.iter_modules(ptq) if hasattr(m, "kernel")}
    assert len(stored) == 15
    for path, module in nnlib.iter_modules(model):
        if path in stored:
            n = stored[path].contract_ndim

            def train_view(w, n=n):  # the forward value, from inside a jitted gradient
                fq = ql.fake_quantize(w, "int4", tile_size=64, contract_ndim=n)
                return jnp.sum(fq * fq), fq

            _, seen = jax.jit(jax.grad(train_view, has_aux=True))(module.kernel[...])
            expected = np.asarray(stored[path].dequantize())
            np.testing.assert_array_equal(np.asarray(seen), expected, err_msg=path)


def test_qat_with_quantised_activations_gives_every_kernel_a_gradient(model, batch):
    apply, params = nnlib.as_function(ql.quantize(model, ql.QatProvider(INT4)))
    grads = jax.grad(loss_fn(apply, batch))(params)
    kernel_grads = [
        g for p, g in jax.tree.leaves_with_path(grads) if "kernel" in jax.tree_util.keystr(p)
    ]
    assert len(kernel_grads) == 15 and all(float(jnp.abs(g).max()) > 0 for g in kernel_grads)


def test_qat_training_then_ptq_conversion_changes_nothing(model, batch):
    qat = ql.quantize(model, ql.QatProvider(INT4))
    apply, params = nnlib.as_function(qat)
    loss = loss_fn(apply, batch)
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    @jax.jit
    def step(params, opt):
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt)
        return optax.apply_updates(params, updates), opt, value

    losses = []
    for _ in range(3):
        params, opt, value = step(params, opt)
        losses.append(float(value))
    assert losses[-1] < losses[0]
    nnx.update(qat, params)
    ptq = ql.quantize(qat, ql.PtqProvider(INT4))
    a = qat(batch["tokens"], batch["positions"])[0]
    b = ptq(batch["tokens"], batch["positions"])[0]
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert isinstance(ptq.layers[0].mlp.down_proj.kernel, ql.QuantizedWeight)


def test_qat_refuses_static_activation_rules():
    with pytest.raises(ql.RuleError, match="QatProvider quantises activations dynamically"):
        ql.QatProvider([ql.QuantRule(".*", "int8", act_qtype="int8", act_static=True)])


@pytest.mark.parametrize("qtype", ["nf4", pytest.param("int4", marks=pytest.mark.slow)])
def test_qlora_trains_only_the_adapters_over_a_frozen_quantised_base(model, batch, qtype):
    base = ql.quantize(model, ql.PtqProvider([ql.QuantRule(".*", qtype, tile_size=64)]))
    adapted = nnlib.apply_lora(base, r"(attn|mlp)/\w+_proj$", rank=4, rngs=nnx.Rngs(1))
    assert len(adapted) == 14
    frozen_before = jax.tree.map(np.asarray, nnx.state(base, ql.QuantizedWeight))
    apply, params = nnlib.as_function(base, wrt=nnx.LoRAParam)
    loss = loss_fn(apply, batch)
    tx = optax.adam(1e-2)
    opt = tx.init(params)
    grad_fn = jax.jit(jax.value_and_grad(loss))
    first = None
    for _ in range(3):
        value, grads = grad_fn(params)
        first = float(value) if first is None else first
        updates, opt = tx.update(grads, opt)
        params = optax.apply_updates(params, updates)
    nnx.update(base, params)
    assert float(loss(params)) < first
    after = nnx.state(base, ql.QuantizedWeight)
    for x, y in zip(jax.tree.leaves(frozen_before), jax.tree.leaves(after), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, np.asarray(y))
    b = base.layers[0].attn.q_proj.lora.b[...]
    assert float(jnp.abs(b).max()) > 0  # adapters moved away from their zero init
