"""Configs saved by older versions of mot, brought up to the fields this version reads.

Every checkpoint stores the run's config as JSON beside it, with the `CONFIG_VERSION` that
wrote it (`saved_form`). `upgrade_config` is the one way an older config is read: it fills
each field added since, with the value that reproduces how the older version ran (the
field did not exist, so the code behaved as this value does). A field this version needs
that no upgrade supplies is a one-line CheckpointError, never a silent default.
"""
from __future__ import annotations

import copy
from typing import Any

import ml_collections

from mot.errors import CheckpointError

CONFIG_VERSION = 10
VERSION_KEY = "config_version"

# Fields read before version 1 with a fallback when a config lacked them: the fallback is
# the behaviour of every run that did not declare them. Sections apply to the datasets named.
_V1_TOP = {"ar_label_smoothing": 0.0, "freeze_understanding": False,
           "eval_samples_per_digit": 0}
_V1_SAMPLE = {"steps": 32, "sampler": "euler", "cfg_scale": 1.0, "shift": 1.0,
              "context_length": 0, "reason_shifts": 0}
_V1_DATA = {"num_threads": 1, "prefetch": 2, "workers": 0, "examples_per_row": 1,
            "validation_size": 0, "channels": 1}
_V1_IMAGE_DATA = {"rotate_degrees": 0.0, "scale_jitter": 0.0, "cutout_size": 0,
                  "cutout_prob": 0.5, "elastic_alpha": 0.0, "elastic_sigma": 1.5,
                  "elastic_prob": 0.5, "read_window": 0}
_V1_DATA_BY_DATASET = {
    "digits": {"image_size": 8, **_V1_IMAGE_DATA},
    "moving_digits": {"canvas_size": 16, "num_frames": 8, "video_layout": "clip",
                      "generation_start": "any", "first_frame_weight": 1.0},
    "image_folder": {"image_size": 8, "invert": False, "resize": "crop", "num_heldout": 64,
                     **_V1_IMAGE_DATA},
    "array_record": {"image_size": 8, "invert": False, "resize": "crop", "num_heldout": 64,
                     **_V1_IMAGE_DATA},
}
# Model fields and the value each took when a saved config lacked it (version 0 filled
# them from the model dataclass's then defaults).
_V1_MODEL = {
    "vocab_size": 272, "d_model": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
    "head_dim": 64, "mlp_dim": 1024, "patch_dim": 4, "modality_patch_dims": [0, 4, 4, 2],
    "rope_sections": [8, 12, 12], "rope_theta": 10000.0, "rope_interleaved": True,
    "time_embed_dim": 256, "experts": "shared", "expert_impl": "auto", "expert_tile": 256,
    "init_generation_from_understanding": False, "scan_layers": True, "scan_unroll": 1,
    "remat_policy": "none", "dtype": "float32", "matmul_dtype": "same",
    "param_dtype": "float32", "norm_eps": 1e-6, "dropout_rate": 0.0, "attention_impl": "auto",
}


def _fill(section: dict, values: dict) -> None:
  for key, value in values.items():
    section.setdefault(key, copy.deepcopy(value))


def _upgrade_to_v1(config: dict) -> None:
  """Version 0 (no version key) -> 1: every field a run reads is declared."""
  _fill(config, _V1_TOP)
  _fill(config.setdefault("sample", {}), _V1_SAMPLE)
  data = config.setdefault("data", {})
  _fill(data, _V1_DATA)
  _fill(data, _V1_DATA_BY_DATASET.get(data.get("dataset"), {}))
  _fill(config.setdefault("model", {}), _V1_MODEL)


# Version 2 added the tiled attention kernels. Before it "auto" never ran blockwise, as
# with a threshold no row reaches; the tile sizes are read only by blockwise and splash.
_V2_MODEL = {"attention_block_q": 512, "attention_block_kv": 512,
             "attention_blockwise_min_length": 2 ** 31 - 1}


def _upgrade_to_v2(config: dict) -> None:
  """Version 1 -> 2: the blockwise/splash attention fields."""
  _fill(config.setdefault("model", {}), _V2_MODEL)


# Version 3: answers' length and the user data's question became fields; before, sampling
# decoded 16 tokens and user data asked the one question there was. Runs denoised pixels
# with an unshifted training timestep.
_V3_TOP = {"resolution_shift_tokens": 0, "latent": {"vae": ""}}
_V3_SAMPLE = {"max_new_tokens": 16}
_V3_USER_DATA = {"question": "Describe this image.", "latent_cache": ""}
_V3_DATA_BY_DATASET = {"image_folder": _V3_USER_DATA, "array_record": _V3_USER_DATA}


def _upgrade_to_v3(config: dict) -> None:
  """Version 2 -> 3: sample.max_new_tokens, the latent space (pixels), the resolution
  shift (off), and user data's data.question and data.latent_cache."""
  _fill(config, _V3_TOP)
  _fill(config.setdefault("sample", {}), _V3_SAMPLE)
  data = config.setdefault("data", {})
  _fill(data, _V3_DATA_BY_DATASET.get(data.get("dataset"), {}))


# Version 4 added pretrained checkpoints (mot.convert, mot.warm_start): the tokenizer,
# init_from and the model fields of Qwen's numerics; every earlier run used the byte
# tokenizer, random initialisation and Qwen3's block.
_V4_TOP = {"tokenizer": "bytes", "init_from": ""}
_V4_MODEL = {"qkv_bias": False, "qk_norm": True, "tie_embeddings": False}


def _upgrade_to_v4(config: dict) -> None:
  """Version 3 -> 4: config.tokenizer, config.init_from and the q/k/v-bias, QK-norm and
  tying fields."""
  _fill(config, _V4_TOP)
  _fill(config.setdefault("model", {}), _V4_MODEL)


# Version 5 let the DM head predict x0 (model.dm_prediction) and a Shapes image carry
# several questions (data.vqa_questions); every earlier run predicted the velocity and
# asked one.
_V5_MODEL = {"dm_prediction": "velocity", "dm_min_time": 0.05}
_V5_DATA_BY_DATASET = {"shapes": {"vqa_questions": 1},
                       "video_folder": {"latent_cache": ""}}   # clips never had latents


def _upgrade_to_v5(config: dict) -> None:
  """Version 4 -> 5: model.dm_prediction (velocity), model.dm_min_time and, for Shapes,
  data.vqa_questions (one); video folders' data.latent_cache (none), now read by name."""
  _fill(config.setdefault("model", {}), _V5_MODEL)
  data = config.setdefault("data", {})
  _fill(data, _V5_DATA_BY_DATASET.get(data.get("dataset"), {}))


# Version 6 added absolute position embeddings of media tokens (model.media_pos_embed);
# every earlier run placed media by M-RoPE alone.
_V6_MODEL = {"media_pos_embed": "none"}


def _upgrade_to_v6(config: dict) -> None:
  """Version 5 -> 6: model.media_pos_embed ("none")."""
  _fill(config.setdefault("model", {}), _V6_MODEL)


# Version 7 let Shapes relation answers write both objects' places first
# (data.relation_trace) and captions to draw be followed by a layout plan
# (data.layout_plan, drawn at sample.plan_temperature; mot.data.shapes_think): every
# earlier Shapes run answered and drew directly.
_V7_SHAPES = {"relation_trace": False, "layout_plan": False}
_V7_DATA_BY_DATASET = {"shapes": _V7_SHAPES, "shapes_video": _V7_SHAPES}
_V7_SAMPLE_BY_DATASET = {"shapes": {"plan_temperature": 1.0}}


def _upgrade_to_v7(config: dict) -> None:
  """Version 6 -> 7: Shapes' data.relation_trace and data.layout_plan (off), and
  sample.plan_temperature (1, unread without a plan)."""
  data = config.setdefault("data", {})
  _fill(data, _V7_DATA_BY_DATASET.get(data.get("dataset"), {}))
  _fill(config.setdefault("sample", {}), _V7_SAMPLE_BY_DATASET.get(data.get("dataset"), {}))


# Version 8 let a layout plan also be drawn as a canvas the DM head reads
# (data.layout_canvas); every earlier Shapes run drew from the plan's text alone.
_V8_SHAPES = {"layout_canvas": False}
_V8_DATA_BY_DATASET = {"shapes": _V8_SHAPES, "shapes_video": _V8_SHAPES}


def _upgrade_to_v8(config: dict) -> None:
  """Version 7 -> 8: Shapes' data.layout_canvas (off)."""
  data = config.setdefault("data", {})
  _fill(data, _V8_DATA_BY_DATASET.get(data.get("dataset"), {}))


# Version 9 let image and video patches read and write their grid neighbours
# (model.patch_mixing); every earlier run projected each patch alone.
_V9_MODEL = {"patch_mixing": "none"}


def _upgrade_to_v9(config: dict) -> None:
  """Version 8 -> 9: model.patch_mixing ("none")."""
  _fill(config.setdefault("model", {}), _V9_MODEL)


# Version 10 let the DM loss be measured on the clean estimate x0 (dm_loss_space); every
# earlier run measured it on the velocity.
_V10_TOP = {"dm_loss_space": "velocity"}


def _upgrade_to_v10(config: dict) -> None:
  """Version 9 -> 10: dm_loss_space ("velocity")."""
  _fill(config, _V10_TOP)


_UPGRADES = {0: _upgrade_to_v1, 1: _upgrade_to_v2, 2: _upgrade_to_v3,
             3: _upgrade_to_v4, 4: _upgrade_to_v5, 5: _upgrade_to_v6,
             6: _upgrade_to_v7, 7: _upgrade_to_v8, 8: _upgrade_to_v9,
             9: _upgrade_to_v10}   # v -> v + 1


def saved_form(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The JSON a checkpoint stores: the config's fields and the version that wrote them."""
  return dict(config.to_dict(), **{VERSION_KEY: CONFIG_VERSION})


def upgrade_config(saved: dict[str, Any]) -> ml_collections.ConfigDict:
  """The ConfigDict of a checkpoint's saved config, in this version's fields."""
  config = copy.deepcopy(dict(saved))
  version = config.pop(VERSION_KEY, 0)
  if not isinstance(version, int) or not 0 <= version <= CONFIG_VERSION:
    raise CheckpointError(f"the checkpoint's config has {VERSION_KEY}={version!r}, but this "
                          f"version of mot reads up to {CONFIG_VERSION}: upgrade mot")
  for v in range(version, CONFIG_VERSION):
    _UPGRADES[v](config)
  return ml_collections.ConfigDict(config)
