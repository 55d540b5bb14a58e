"""Starting a run from another workdir's weights: `config.init_from`.

  python -m mot.convert from_hf --hf_dir ~/models/Qwen3-0.6B --workdir runs/qwen3 --experts mode
  python train.py --config configs/pretrained.py --workdir runs/ft --config.init_from=runs/qwen3

`resolve(config)` takes the model fields that fix the parameters (`FROM_INIT`: sizes,
vocabulary, numerics, experts, layer stacking) and the tokenizer from the newest checkpoint
of `init_from` (a `mot.convert` workdir or any training workdir). A config leaves them
unset (`configs/pretrained.py` declares them as placeholders); a value it sets that differs
from the checkpoint's is refused, naming every such field. The run's own choices (compute
dtypes, remat, scan unrolling, dropout, kernels: `RUN_CHOICES`) stay the config's.

`initial_params` reads that checkpoint's parameters (EMA when present) onto the run's
shardings; training starts from them at step 0 with fresh optimizer moments and data. A
run whose workdir already holds checkpoints resumes from them instead, as always.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import ml_collections

from mot import checkpoint as ckpt_lib
from mot import config_upgrade
from mot.config import ModelConfig
from mot.errors import CheckpointError, ConfigError, field

# Model fields a run chooses for itself: how it computes, not what the parameters are.
RUN_CHOICES = ("expert_impl", "expert_tile", "init_generation_from_understanding",
               "scan_unroll", "remat_policy", "dtype", "matmul_dtype", "dropout_rate",
               "attention_impl")
FROM_INIT = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in RUN_CHOICES)


def _source(config) -> str:
  return str(field(config, "init_from"))


def _newest_config(workdir: str) -> ml_collections.ConfigDict:
  """The upgraded config of `workdir`'s newest checkpoint (one-line errors naming it)."""
  try:
    step = ckpt_lib.available_steps(workdir)[-1]
    return config_upgrade.upgrade_config(ckpt_lib.saved_config(workdir, step))
  except (CheckpointError, OSError, ValueError) as e:
    raise CheckpointError(f"config.init_from={workdir} is not a mot workdir with a "
                          f"checkpoint ({' '.join(str(e).split())}): pass a mot.convert "
                          "output or a training workdir") from None


def _json(value: Any) -> Any:
  return json.loads(json.dumps(value))


def _conflicts(config, source) -> list[str]:
  """`config.model.X` / `config.tokenizer` set to a value other than the checkpoint's."""
  out = []
  for name in FROM_INIT:
    ours = field(config.model, name, "config.model")
    if ours is not None and _json(ours) != _json(source.model[name]):
      out.append(f"model.{name}={ours!r} (checkpoint: {source.model[name]!r})")
  ours = field(config, "tokenizer")
  if ours is not None and ours != source.tokenizer:
    out.append(f"tokenizer={ours!r} (checkpoint: {source.tokenizer!r})")
  return out


def resolve(config) -> ml_collections.ConfigDict:
  """`config` with the model fields and tokenizer of `config.init_from` filled in (a
  copy; unchanged without init_from). Raises ConfigError for conflicting or unset fields
  and CheckpointError for an init_from that is not a workdir with a checkpoint."""
  unset = [f"model.{n}" for n in FROM_INIT if field(config.model, n, "config.model") is None]
  unset += ["tokenizer"] if field(config, "tokenizer") is None else []
  if not _source(config):
    if unset:
      raise ConfigError(f"config.{', config.'.join(unset)} are not set: this config takes "
                        "them from a checkpoint, e.g. --config.init_from=runs/qwen3 (a "
                        "python -m mot.convert output)")
    return config
  source = _newest_config(_source(config))
  conflicts = _conflicts(config, source)
  if conflicts:
    raise ConfigError(f"config.init_from={_source(config)} fixes fields the config sets "
                      f"otherwise: {'; '.join(conflicts)}; leave them unset or use the "
                      "checkpoint's values")
  config = config.copy_and_resolve_references()
  with config.unlocked():
    for name in FROM_INIT:
      value = source.model[name]
      config.model[name] = tuple(value) if isinstance(value, list) else value
    config.tokenizer = source.tokenizer
  return config


def initial_params(config, shardings: Any) -> Any:
  """The parameters of `config.init_from`'s newest checkpoint (EMA when present), placed
  with `shardings` (the run's parameter shardings)."""
  params, _, step = ckpt_lib.restore_params(_source(config))
  want = jax.tree_util.tree_structure(shardings)
  if jax.tree_util.tree_structure(params) != want:
    raise CheckpointError(f"the parameters of config.init_from={_source(config)} (step "
                          f"{step}) do not have this model's layout")
  return jax.device_put(params, shardings)
