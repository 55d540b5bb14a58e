"""What a checkpoint needs to become a `mot.Pipeline`: its saved config brought up to date
and checked, the mesh and the parameters' sharded shapes when sampling on one, the VAE of
a latent run, the question the run's reading task asked, and how long and in what form
its answers are."""
from __future__ import annotations

import logging
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from mot import config as config_lib
from mot import config_upgrade, latent, sharding
from mot import step as step_lib
from mot import vae as vae_lib
from mot.data import (input_pipeline, moving_digits, shapes, shapes_grammar, shapes_tasks,
                      shapes_think, shapes_video_tasks, tasks)
from mot.errors import CheckpointError, ConfigError
from mot.model import MoT, inputs_from_batch


def load_vae(config: Any) -> vae_lib.VAE | None:
  """The VAE of a latent run (config.latent.vae), or None for pixels."""
  path = latent.vae_dir(config)
  if not path:
    return None
  try:
    return vae_lib.load_diffusers(path)
  except vae_lib.VAEError as e:
    raise ConfigError(f"config.latent.vae: {e}") from None


def run_question(config: Any) -> str:
  """The question the run's reading task asked: the digits', the moving digits', Shapes'
  "Describe this image.", or config.data.question (user data)."""
  dataset = config.data.dataset
  if dataset in input_pipeline.DIGIT_DATASETS:
    return moving_digits.QUESTION if dataset == "moving_digits" else tasks.QUESTION
  if dataset == shapes_tasks.DATASET:
    return shapes_grammar.DESCRIBE_QUESTION
  if dataset == shapes_video_tasks.DATASET:
    return shapes_grammar.COUNT_QUESTION
  return str(config.data.question)


def answer_budgets(config: Any, tokenizer, answer: int, draw: int) -> tuple[int, int]:
  """(reason's, think_then_draw's) default token budgets, end token included: at least
  `answer` and `draw`, and for Shapes enough for the grammar's longest answer (a caption,
  or a traced relation answer when data.relation_trace) and think-then-draw answer or
  layout plan (data.layout_plan)."""
  if config.data.dataset != shapes_tasks.DATASET:
    return answer, draw
  options = shapes_tasks.scene_options(config.data)
  longest = shapes.max_text_tokens(options, tokenizer)
  answers, draws = longest["answer"], longest["draw_answer"]
  if config.data.relation_trace:
    answers = max(answers, shapes_think.longest_trace(options, tokenizer))
  if config.data.layout_plan:
    draws = max(draws, shapes_think.longest_plan(options, tokenizer))
  return max(answer, answers + 1), max(draw, draws + 1)


def answer_reader(config: Any) -> Callable[[str], str]:
  """What `Pipeline.reason` returns of a decoded reply: for a Shapes run trained with
  relation traces the text after the trace (`shapes_think.final_answer`), else the reply
  stripped."""
  if config.data.dataset == shapes_tasks.DATASET and config.data.relation_trace:
    return shapes_think.final_answer
  return str.strip


def checked_config(saved: dict, workdir: str, step: int | None = None
                   ) -> ml_collections.ConfigDict:
  """A checkpoint's saved config, upgraded and validated; CheckpointError if invalid."""
  config = ml_collections.ConfigDict(config_upgrade.upgrade_config(saved))
  logging.disable(logging.WARNING)   # validation may warn about packing training rows
  try:
    config_lib.validate(config)
  except ConfigError as e:
    where = f"checkpoint {step}" if step is not None else "the checkpoint"
    raise CheckpointError(f"the config saved with {where} in {workdir} is not valid: {e}"
                          ) from None
  finally:
    logging.disable(logging.NOTSET)
  return config


def mesh_of(config, mesh_shape: str) -> jax.sharding.Mesh:
  """The mesh `mesh_shape` over the config's mesh axes and this process's devices."""
  with config.unlocked():
    config.mesh_shape = mesh_shape
  return sharding.make_mesh(config)


def sharded_param_shapes(config, mesh) -> Any:
  """ShapeDtypeStructs of the model's parameters carrying their NamedShardings on `mesh`
  by the config's logical rules (shapes from `jax.eval_shape`: nothing allocated)."""
  model, rules = MoT(config_lib.validate(config)), sharding.logical_rules(config)
  inputs = inputs_from_batch(jax.tree.map(jnp.asarray,
                                          step_lib.dummy_batch(model.cfg, 8)))
  with sharding.on_mesh(mesh, rules):
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), inputs)["params"]
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      nn.meta.unbox(boxed), shardings)
