"""The model and step of train_jax_policy.py (flax, optax): the same policy as
train_torch_policy.py's, and its jitted training step. Kept apart from the training loop so the
loop runs (and is tested) where only jax, or its stand-in, is importable
(python/tests/test_policy_examples.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn


class BasicBlock(nn.Module):
    features: int
    stride: int
    dtype: jnp.dtype = jnp.bfloat16

    @nn.compact
    def __call__(self, x):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
        norm = functools.partial(nn.GroupNorm, num_groups=min(32, self.features), dtype=self.dtype)
        y = nn.relu(norm()(conv(self.features, (3, 3), (self.stride, self.stride))(x)))
        y = norm()(conv(self.features, (3, 3))(y))
        if x.shape[-1] != self.features or self.stride != 1:
            x = norm()(conv(self.features, (1, 1), (self.stride, self.stride))(x))
        return nn.relu(x + y)


class Encoder(nn.Module):
    width: int
    blocks: tuple
    dtype: jnp.dtype = jnp.bfloat16

    @nn.compact
    def __call__(self, x):  # [N, H, W, 3]
        x = nn.Conv(self.width, (7, 7), (2, 2), use_bias=False, dtype=self.dtype)(x)
        x = nn.relu(nn.GroupNorm(num_groups=min(32, self.width), dtype=self.dtype)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        for i, n in enumerate(self.blocks):
            for j in range(n):
                x = BasicBlock(self.width * 2 ** i, 2 if (j == 0 and i > 0) else 1, self.dtype)(x)
        return jnp.mean(x, axis=(1, 2))


class Policy(nn.Module):
    cameras: tuple
    action_shape: tuple
    width: int
    blocks: tuple
    hidden: int

    @nn.compact
    def __call__(self, images, state):
        feats = [Encoder(self.width, self.blocks, name=f"enc_{c}")(images[c]) for c in self.cameras]
        x = jnp.concatenate(feats + [state.astype(jnp.bfloat16)], axis=-1)
        x = nn.gelu(nn.Dense(self.hidden, dtype=jnp.bfloat16)(x))
        x = nn.gelu(nn.Dense(self.hidden, dtype=jnp.bfloat16)(x))
        x = nn.Dense(int(np.prod(self.action_shape)), dtype=jnp.bfloat16)(x)
        return x.astype(jnp.float32).reshape((x.shape[0],) + tuple(self.action_shape))


_MEAN = jnp.array([0.485, 0.456, 0.406])
_STD = jnp.array([0.229, 0.224, 0.225])


def augment(frames, crop, key):
    """uint8 [B, 1, H, W, 3] -> float [B, crop, crop, 3]: a random crop per sample, normalised."""
    b, t, h, w, c = frames.shape
    x = frames.reshape(b * t, h, w, c)
    crop = min(crop, h, w)
    ky, kx = jax.random.split(key)
    ys = jax.random.randint(ky, (b * t,), 0, h - crop + 1)
    xs = jax.random.randint(kx, (b * t,), 0, w - crop + 1)
    cut = jax.vmap(lambda img, y, x0: jax.lax.dynamic_slice(img, (y, x0, 0), (crop, crop, c)))
    x = cut(x, ys, xs).astype(jnp.float32) / 255.0
    return ((x - _MEAN) / _STD).astype(jnp.bfloat16)


def make_train_step(model, tx, cams, crop):
    """step(carry, batch) -> (carry, loss), jitted; carry = (params, opt_state, key). Dispatched
    asynchronously: the returned loss is a device value the caller waits for only when it reads
    it."""

    @jax.jit
    def train_step(params, opt_state, batch, key):
        keys = jax.random.split(key, len(cams))
        images = {c: augment(batch[c], crop, k) for c, k in zip(cams, keys)}
        state = batch["observation.state"].reshape(batch["action"].shape[0], -1)

        def loss_fn(p):
            pred = model.apply(p, images, state)
            valid = (~batch["action_is_pad"])[..., None].astype(jnp.float32)
            err = (pred - batch["action"]) ** 2 * valid
            return err.sum() / jnp.maximum(valid.sum() * pred.shape[-1], 1.0)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step(carry, batch):
        params, opt_state, key = carry
        key, sub = jax.random.split(key)
        params, opt_state, loss = train_step(params, opt_state, batch, sub)
        return (params, opt_state, key), loss

    return step
