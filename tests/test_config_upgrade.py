"""Saved configs of older versions are read through one explicit upgrade."""
import jax
import jax.numpy as jnp
import pytest

from configs import digits, image_folder, moving_digits, shapes, shapes_video
from mot import attention
from mot import config as config_lib
from mot import config_upgrade
from mot.errors import CheckpointError

CURRENT = {"digits": digits.get_config("tiny"), "moving_digits": moving_digits.get_config("tiny"),
           "image_folder": image_folder.get_config("tiny")}


@pytest.mark.parametrize("name", sorted(CURRENT))
def test_a_current_config_round_trips_unchanged(name):
  config = CURRENT[name]
  saved = config_upgrade.saved_form(config)
  assert saved[config_upgrade.VERSION_KEY] == config_upgrade.CONFIG_VERSION
  assert config_upgrade.upgrade_config(saved).to_dict() == config.to_dict()


def _version_0(config):
  """The config as version 0 saved it: without the fields version 1 declared."""
  saved = config.to_dict()
  for key in ("ar_label_smoothing", "freeze_understanding", "eval_samples_per_digit"):
    del saved[key]
  for key in ("shift", "context_length", "reason_shifts"):
    del saved["sample"][key]
  for key in ("num_threads", "prefetch", "workers", "channels", "image_size"):
    saved["data"].pop(key, None)
  for key in ("vocab_size", "norm_eps", "scan_unroll", "matmul_dtype", "attention_impl"):
    del saved["model"][key]
  return saved


def test_a_version_0_digits_config_runs_as_version_0_ran():
  upgraded = config_upgrade.upgrade_config(_version_0(CURRENT["digits"]))
  assert upgraded.data.image_size == 8 and upgraded.data.channels == 1
  assert (upgraded.data.num_threads, upgraded.data.prefetch, upgraded.data.workers) == (1, 2, 0)
  assert upgraded.sample.reason_shifts == 0 and upgraded.sample.context_length == 0
  assert upgraded.ar_label_smoothing == 0.0 and not upgraded.freeze_understanding
  # Model fields take the values version 0 computed with when they were absent.
  assert upgraded.model.matmul_dtype == "same" and upgraded.model.scan_unroll == 1
  assert upgraded.model.vocab_size == 272 and upgraded.model.norm_eps == 1e-6
  config_lib.validate(upgraded)                      # a complete, valid run config


def test_a_version_0_video_config_keeps_the_one_block_layout():
  saved = _version_0(CURRENT["moving_digits"])
  for key in ("video_layout", "generation_start", "first_frame_weight"):
    del saved["data"][key]
  upgraded = config_upgrade.upgrade_config(saved)
  assert upgraded.data.video_layout == "clip" and upgraded.data.generation_start == "any"
  assert "read_window" not in upgraded.data          # image-only fields stay out of video


def test_a_version_1_config_gains_the_tiled_attention_fields_and_keeps_its_kernel():
  """Version 1 predates blockwise and splash: upgraded, "auto" never runs blockwise."""
  saved = dict(config_upgrade.saved_form(CURRENT["digits"]), config_version=1)
  for key in ("attention_block_q", "attention_block_kv", "attention_blockwise_min_length"):
    del saved["model"][key]
  upgraded = config_upgrade.upgrade_config(saved)
  model = config_lib.validate(upgraded)
  q = jax.ShapeDtypeStruct((1, 2 ** 20, model.num_heads, model.head_dim), jnp.float32)
  assert attention.attention_implementation(model, q) != "blockwise"
  assert (upgraded.model.attention_block_q, upgraded.model.attention_block_kv) == (512, 512)


def test_a_newer_config_version_is_refused_in_one_line():
  saved = dict(config_upgrade.saved_form(CURRENT["digits"]), config_version=99)
  with pytest.raises(CheckpointError, match="config_version=99.*upgrade mot") as e:
    config_upgrade.upgrade_config(saved)
  assert "\n" not in str(e.value)


def test_a_run_config_missing_a_field_names_it():
  config = digits.get_config("tiny")
  del config.data["channels"]
  with pytest.raises(config_lib.ConfigError, match=r"config.data.channels is not declared"):
    config_lib.validate(config)
  config = digits.get_config("tiny")
  del config.model["norm_eps"]
  with pytest.raises(config_lib.ConfigError, match="config.model lacks norm_eps"):
    config_lib.validate(config)


def test_a_version_2_image_folder_config_samples_as_version_2_did():
  """Version 3 made the answer length, the user data's question and the latent space
  fields: a version-2 checkpoint decodes 16 tokens, asks "Describe this image." and
  denoises pixels with unshifted timesteps, as version 2 did."""
  saved = config_upgrade.saved_form(CURRENT["image_folder"])
  saved[config_upgrade.VERSION_KEY] = 2
  del saved["sample"]["max_new_tokens"], saved["data"]["question"]
  del saved["data"]["latent_cache"], saved["latent"], saved["resolution_shift_tokens"]
  upgraded = config_upgrade.upgrade_config(saved)
  assert upgraded.sample.max_new_tokens == 16 and upgraded.resolution_shift_tokens == 0
  assert upgraded.data.question == "Describe this image." and upgraded.latent.vae == ""
  assert upgraded.data.latent_cache == ""
  digits_v2 = dict(config_upgrade.saved_form(CURRENT["digits"]), config_version=2)
  del digits_v2["sample"]["max_new_tokens"], digits_v2["latent"]
  upgraded = config_upgrade.upgrade_config(digits_v2)
  assert upgraded.sample.max_new_tokens == 16 and "question" not in upgraded.data
  assert upgraded.to_dict() == CURRENT["digits"].to_dict()


def test_a_version_4_config_keeps_predicting_the_velocity():
  """Version 5 added model.dm_prediction: older checkpoints predicted the velocity."""
  saved = dict(config_upgrade.saved_form(CURRENT["digits"]), config_version=4)
  del saved["model"]["dm_prediction"], saved["model"]["dm_min_time"]
  upgraded = config_upgrade.upgrade_config(saved)
  assert upgraded.model.dm_prediction == "velocity" and upgraded.model.dm_min_time == 0.05
  assert upgraded.to_dict() == CURRENT["digits"].to_dict()
  current = shapes.get_config("tiny")        # and a Shapes run asked one question an image
  saved = dict(config_upgrade.saved_form(current), config_version=4)
  del saved["model"]["dm_prediction"], saved["model"]["dm_min_time"]
  del saved["data"]["vqa_questions"]
  current.model.dm_prediction = "velocity"   # today's Shapes default predicts x0
  assert config_upgrade.upgrade_config(saved).to_dict() == current.to_dict()


@pytest.mark.parametrize("version,name", [
    (5, "media_pos_embed"),   # version 6: no absolute embedding before
    (8, "patch_mixing")])     # version 9: each patch projected alone before
def test_a_later_model_field_takes_the_value_older_runs_had(version, name):
  """A model field added in version + 1 is "none" for a version's checkpoint: how that
  version's code ran."""
  current = shapes.get_config("tiny")
  saved = dict(config_upgrade.saved_form(current), config_version=version)
  del saved["model"][name]
  current.model[name] = "none"
  assert config_upgrade.upgrade_config(saved).to_dict() == current.to_dict()


def test_a_version_6_shapes_config_answers_and_draws_directly():
  """Version 7 added data.relation_trace and data.layout_plan: older Shapes runs answered
  yes / no at once and drew without a plan."""
  current = shapes.get_config("tiny")
  saved = dict(config_upgrade.saved_form(current), config_version=6)
  del saved["data"]["relation_trace"], saved["data"]["layout_plan"]
  del saved["sample"]["plan_temperature"]
  current.data.relation_trace = current.data.layout_plan = False
  current.sample.plan_temperature = 1.0
  assert config_upgrade.upgrade_config(saved).to_dict() == current.to_dict()


def test_a_version_7_shapes_config_draws_from_the_plan_text_alone():
  """Version 8 added data.layout_canvas: older Shapes runs drew without a canvas."""
  for name, module in (("shapes", shapes), ("shapes_video", shapes_video)):
    current = module.get_config("tiny")
    saved = dict(config_upgrade.saved_form(current), config_version=7)
    del saved["data"]["layout_canvas"]
    assert config_upgrade.upgrade_config(saved).to_dict() == current.to_dict(), name


def test_a_version_9_config_keeps_the_velocity_loss():
  """Version 10 added dm_loss_space: every earlier run measured the loss on the velocity."""
  current = shapes.get_config("tiny")
  saved = dict(config_upgrade.saved_form(current), config_version=9)
  del saved["dm_loss_space"]
  assert config_upgrade.upgrade_config(saved).to_dict() == current.to_dict()
  current.dm_loss_space = "x0"              # a current run's choice is kept as saved
  saved = config_upgrade.saved_form(current)
  assert config_upgrade.upgrade_config(saved).dm_loss_space == "x0"
