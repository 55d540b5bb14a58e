"""Start from a pretrained language model: Hugging Face Qwen3 / Qwen2 checkpoints (and the
language model of Qwen3-VL) to mot workdirs, and back.

  python -m mot.convert from_hf --hf_dir ~/models/Qwen3-0.6B --workdir runs/qwen3 \
      [--experts shared|mode] [--config configs/shapes.py[:tiny]]
  python -m mot.convert to_hf --workdir runs/qwen3 --out /tmp/qwen3-hf [--dtype bfloat16]

from_hf writes a workdir like train.py's: an orbax checkpoint at step 0 ({"state":
TrainState, "rng": ...}, parameters = EMA parameters, zero optimizer moments) with its run
config (configs/digits.py's, or --config's data, training and patch / timestep widths,
with the backbone's fields from config.json, float32 compute, and `tokenizer` naming
WORKDIR/pretrained/tokenizer.json), plus the model's small files (config.json,
tokenizer files) under WORKDIR/pretrained/. Tensors stream one at a time into preallocated
(layer-stacked) parameters: the conversion holds the float32 parameters about once.
`--experts mode` copies the understanding weights into the generation expert (BAGEL);
the DM head, patch projection and timestep embedding start fresh (config.seed). mot's
special tokens (missing BOS/EOS/PAD, media markers; `mot.tokenizer`) are new embedding
rows, the mean of the pretrained ones.

to_hf writes the understanding path (expert 0, EMA parameters) as the architecture it
computes (config.json, model.safetensors, and the tokenizer files when the run has them),
with the pretrained vocabulary's rows only: mot's appended rows have no token in
tokenizer.json. Every bad input is one `error:` line and nothing written.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
from absl import flags, logging
from flax import traverse_util
from ml_collections import config_flags

from configs import digits
from mot import checkpoint as ckpt_lib
from mot import cli
from mot import config as config_lib
from mot import config_upgrade, hf_arch, hf_io, tokenizer
from mot import step as step_lib
from mot.errors import CheckpointError, ConfigError
from mot.experts import num_experts
from mot.model import MoT, inputs_from_batch

PRETRAINED = "pretrained"    # WORKDIR/pretrained/: the model's config and tokenizer files
TOKENIZER = "tokenizer.json"
COPIED = (hf_io.CONFIG, TOKENIZER, "tokenizer_config.json", "generation_config.json")
EXPERTS = ("shared", "mode")
TIED_HEAD = "lm_head.weight"   # the output head's tensor (every supported architecture)


@dataclasses.dataclass
class Import:
  """A checked Hugging Face folder, ready to convert (nothing written yet)."""
  hf_dir: str
  arch: hf_arch.Arch
  config: ml_collections.ConfigDict    # the run config the workdir will hold
  model: config_lib.ModelConfig
  vocab: int                           # the checkpoint's vocabulary (embedding rows)
  reader: hf_io.SafetensorsReader
  entries: list[hf_arch.Entry]


# ----------------------------------------------------------------------------------------
# Checks (before anything is written).
# ----------------------------------------------------------------------------------------
def run_config(fields: dict, experts: str, tokenizer_path: str,
               base: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """`base` (default: configs/digits.py's run config) with the pretrained model's fields,
  computing in float32 (the exact numerics of the original) with stacked layers. The
  base's other fields (data, training, the patch and timestep widths the checkpoint does
  not determine) stay, so the workdir fine-tunes with that base's data."""
  config = digits.get_config() if base is None else base.copy_and_resolve_references()
  config.tokenizer = os.path.abspath(tokenizer_path)
  config.model.update(fields)
  config.model.update(experts=experts, init_generation_from_understanding=experts == "mode",
                      dtype="float32", matmul_dtype="same", param_dtype="float32",
                      scan_layers=True)
  return config


def vocabulary(hf_dir: str, vocab: int) -> int:
  """Ids of the model with mot's special tokens appended to the checkpoint's `vocab`."""
  path = os.path.join(hf_dir, TOKENIZER)
  if not os.path.isfile(path):
    raise ConfigError(f"{hf_dir} has no {TOKENIZER}: mot reads and writes the model's text "
                      "with it; copy it from the model's release")
  try:
    size = vocab + len(tokenizer.appended_names(path))
    tokenizer.HFTokenizer(path, size)
  except Exception as e:  # the tokenizers package raises bare Exceptions on bad files
    raise ConfigError(f"cannot use {path}: {' '.join(str(e).split())}") from None
  return size


def check_tied_head(reader: hf_io.SafetensorsReader, entries: list[hf_arch.Entry]) -> None:
  """Some published tied checkpoints store the head anyway (mlx-lm drops it on load): it
  is accepted, and dropped, when it equals the embedding, exactly or within the rounding
  of the coarser of their two dtypes. Both are read in the same chunks of rows, as the
  conversion reads: no whole tensor sits in memory."""
  embed = next(e.name for e in entries if e.path == hf_arch.EMBEDDING)
  where = reader.entries[TIED_HEAD][0]
  differs = reader.shape(TIED_HEAD) != reader.shape(embed)
  if not differs:
    eps = max(ml_dtypes.finfo(reader.dtype(n)).eps for n in (TIED_HEAD, embed))
    row_bytes = 4 * int(np.prod(reader.shape(embed)[1:]))
    per_chunk = max(1, hf_io.CHUNK_BYTES // row_bytes)   # the same rows from both
    for (_, head), (_, table) in zip(reader.chunks(TIED_HEAD, per_chunk),
                                     reader.chunks(embed, per_chunk)):
      head, table = head.astype(np.float32), table.astype(np.float32)
      if not np.allclose(head, table, rtol=eps, atol=0):   # equal values are within it
        differs = True
        break
  if differs:
    raise CheckpointError(
        f"tensor {TIED_HEAD} in {where} differs from {embed}: the checkpoint's head is not "
        "tied although its config.json says tie_word_embeddings=true")


def check_tensors(hf_dir: str, reader: hf_io.SafetensorsReader, imp_arch: hf_arch.Arch,
                  entries: list[hf_arch.Entry], shapes: Any, model, vocab: int) -> None:
  """Every tensor the config implies is present with its shape, and no other tensor is
  (besides a skipped vision tower, recomputed buffers and a tied head equal to the
  embedding)."""
  names = reader.names()
  skipped = {n for n in names if imp_arch.skipped_prefix
             and n.startswith(imp_arch.skipped_prefix)}
  ignored = {n for n in names if n.endswith(hf_arch.IGNORED_SUFFIXES)}
  expected = {e.name for e in entries}
  missing = sorted(expected - names)
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise CheckpointError(
        f"tensor {missing[0]}{more} is missing from the safetensors files in {hf_dir}: "
        f"the weights do not match its config.json ({imp_arch.name})")
  if imp_arch.tie and TIED_HEAD in names:
    check_tied_head(reader, entries)
    ignored.add(TIED_HEAD)
  extra = sorted(names - expected - skipped - ignored)
  if extra:
    raise CheckpointError(
        f"tensor {extra[0]} in {reader.entries[extra[0]][0]} is not part of a {imp_arch.name} "
        f"with this config.json (e.g. tie_word_embeddings={imp_arch.tie}): the weights do "
        "not match config.json")
  for e in entries:
    want = hf_arch.expected_shape(e, hf_arch.mot_array(shapes, model, e).shape, vocab)
    if reader.shape(e.name) != want:
      raise CheckpointError(
          f"tensor {e.name} in {reader.entries[e.name][0]} has shape "
          f"{list(reader.shape(e.name))} but config.json implies {list(want)}")
  if skipped:
    logging.info("Leaving out the vision tower: %d tensors under %s", len(skipped),
                 imp_arch.skipped_prefix)


def abstract_params(model: MoT) -> dict:
  """ShapeDtypeStructs of the model's (unboxed) parameters."""
  inputs = inputs_from_batch(jax.tree.map(jnp.asarray, step_lib.dummy_batch(model.cfg, 1)))
  return jax.eval_shape(lambda r: nn.meta.unbox(model.init(r, inputs)["params"]),
                        jax.random.PRNGKey(0))


def plan_import(hf_dir: str, workdir: str, experts: str,
                base: ml_collections.ConfigDict | None = None) -> Import:
  """Reads and checks everything a conversion needs; raises ConfigError or
  CheckpointError (one line) for any bad input."""
  if experts not in EXPERTS:
    raise ConfigError(f"--experts={experts!r} is unknown: use one of {EXPERTS}")
  where = os.path.join(hf_dir, hf_io.CONFIG)
  arch = hf_arch.arch_of(hf_io.read_config(hf_dir), where)
  fields = hf_arch.model_fields(arch, where)
  vocab = fields["vocab_size"]
  fields["vocab_size"] = vocabulary(hf_dir, vocab)
  config = run_config(fields, experts, os.path.join(hf_dir, TOKENIZER), base)
  model = config_lib.validate(config)   # with the source's tokenizer.json, then the copy's:
  config.tokenizer = os.path.join(os.path.abspath(workdir), PRETRAINED, TOKENIZER)
  reader = hf_io.SafetensorsReader(hf_dir)
  entries = hf_arch.tensor_table(arch.prefix, model)
  shapes = jax.tree.map(lambda s: np.broadcast_to(np.float32(0), s.shape),
                        abstract_params(MoT(model)))
  check_tensors(hf_dir, reader, arch, entries, shapes, model, vocab)
  return Import(hf_dir, arch, config, model, vocab, reader, entries)


def _same_json(a: Any, b: Any) -> bool:
  return json.loads(json.dumps(a)) == json.loads(json.dumps(b))


def workdir_done(workdir: str, config: ml_collections.ConfigDict) -> bool:
  """Whether `workdir` already holds this very conversion (then there is nothing to do).
  A file, or a directory holding anything else, is refused."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir {workdir} is a file: pass a new directory")
  if not os.path.isdir(workdir) or not os.listdir(workdir):
    return False
  try:
    if _same_json(ckpt_lib.saved_config(workdir, 0), config_upgrade.saved_form(config)):
      return True
  except (OSError, ValueError):
    pass
  raise ConfigError(f"--workdir {workdir} already holds a different run: pass a new or "
                    "empty directory")


# ----------------------------------------------------------------------------------------
# Parameters.
# ----------------------------------------------------------------------------------------
def fresh_params(model: MoT, rng: jax.Array, keep: set[tuple[str, ...]]) -> dict:
  """{path: array} of the parameters at `keep`, initialised as train.py does; only those
  are computed (the rest of the init is dead code to XLA)."""
  inputs = inputs_from_batch(jax.tree.map(jnp.asarray, step_lib.dummy_batch(model.cfg, 1)))

  def init(r):
    flat = traverse_util.flatten_dict(nn.meta.unbox(model.init(r, inputs)["params"]))
    return {"/".join(p): flat[p] for p in keep}

  out = jax.device_get(jax.jit(init)(rng))
  return {tuple(k.split("/")): np.asarray(v) for k, v in out.items()}


def mapped_paths(entries: list[hf_arch.Entry], model: config_lib.ModelConfig) -> set:
  """Parameter paths the checkpoint fills."""
  def full(e):
    if e.layer is None:
      return e.path
    return ("backbone", "layers", "block", *e.path) if model.scan_layers else (
        "backbone", f"layers_{e.layer}", *e.path)
  return {full(e) for e in entries}


def append_rows(params: dict, model: config_lib.ModelConfig, vocab: int) -> None:
  """mot's appended ids start as the mean of the pretrained embedding (and unembedding)."""
  table = params["embed"]["token_embedding"]
  table[vocab:] = np.mean(table[:vocab], axis=0, dtype=np.float64)
  if not model.tie_embeddings:
    kernel = params["ar_head"]["unembed"]["kernel"]
    kernel[:, vocab:] = np.mean(kernel[:, :vocab], axis=1, keepdims=True, dtype=np.float64)


def build_params(imp: Import) -> dict:
  """The mot parameters: the checkpoint's tensors read one at a time into preallocated
  float32 arrays (every expert a copy of the understanding expert), the rest fresh."""
  model = MoT(imp.model)
  shapes = traverse_util.flatten_dict(abstract_params(model))
  filled = mapped_paths(imp.entries, imp.model)
  rng = jax.random.split(jax.random.PRNGKey(imp.config.seed), 3)[0]   # as build_training
  flat = fresh_params(model, rng, set(shapes) - filled)
  flat.update({p: np.zeros(shapes[p].shape, np.float32) for p in filled})
  params = traverse_util.unflatten_dict(flat)
  for n, e in enumerate(imp.entries):
    first = hf_arch.hf_view(e.kind, hf_arch.mot_array(params, imp.model, e), imp.vocab)
    imp.reader.read_into(e.name, first)
    for expert in range(1, num_experts(imp.model)):
      hf_arch.hf_view(e.kind, hf_arch.mot_array(params, imp.model, e, expert),
                      imp.vocab)[...] = first
    if n % 50 == 0:
      logging.info("Read %d / %d tensors", n + 1, len(imp.entries))
  append_rows(params, imp.model, imp.vocab)
  return params


# ----------------------------------------------------------------------------------------
# Workdirs.
# ----------------------------------------------------------------------------------------
def initial_state(config, params: dict) -> dict:
  """train.py's checkpoint item at step 0: {"state": TrainState, "rng": step key}. The
  optimizer state is zeros (broadcast views: no memory), the EMA the parameters."""
  tx = step_lib.make_optimizer(config)
  opt = jax.eval_shape(tx.init, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                             params))
  opt = jax.tree.map(lambda s: np.broadcast_to(np.zeros((), s.dtype), s.shape), opt)
  state = step_lib.TrainState(step=np.zeros((), np.int32), params=params, opt_state=opt,
                               ema_params=params, nonfinite_run=np.zeros((), np.int32))
  rng = jax.random.split(jax.random.PRNGKey(config.seed), 3)[1]      # as build_training
  return {"state": state, "rng": np.asarray(rng)}


def _staging(target: str) -> str:
  """A sibling directory to write into before the final rename (nothing half-written
  ever sits at `target`)."""
  target = os.path.abspath(target)
  os.makedirs(os.path.dirname(target), exist_ok=True)
  return f"{target}.partial-{os.getpid()}"


def _publish(staging: str, target: str) -> None:
  if os.path.isdir(target):
    os.rmdir(target)   # empty: checked before
  os.rename(staging, target)


def copy_files(src_dir: str, dst_dir: str) -> None:
  os.makedirs(dst_dir, exist_ok=True)
  for name in COPIED:
    if os.path.isfile(os.path.join(src_dir, name)):
      shutil.copyfile(os.path.join(src_dir, name), os.path.join(dst_dir, name))


def write_workdir(imp: Import, params: dict, workdir: str) -> None:
  staging = _staging(workdir)
  try:
    copy_files(imp.hf_dir, os.path.join(staging, PRETRAINED))
    ckpt_lib.save_host_state(staging, 0, initial_state(imp.config, params),
                             config_upgrade.saved_form(imp.config), {"history": []})
    _publish(staging, workdir)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def from_hf(hf_dir: str, workdir: str, experts: str = "shared",
            config: ml_collections.ConfigDict | None = None) -> None:
  """Converts the Hugging Face folder `hf_dir` into the mot workdir `workdir`, its run
  config built on `config` (default: configs/digits.py's; see run_config)."""
  imp = plan_import(hf_dir, workdir, experts, config)
  if workdir_done(workdir, imp.config):
    logging.info("%s already holds this conversion of %s: nothing to do", workdir, hf_dir)
    return
  logging.info("Converting %s (%s, %d layers, vocabulary %d + %d mot ids) to %s",
               hf_dir, imp.arch.name, imp.model.num_layers, imp.vocab,
               imp.model.vocab_size - imp.vocab, workdir)
  params = build_params(imp)
  write_workdir(imp, params, workdir)
  logging.info("Wrote %s (step 0, experts=%s)", workdir, experts)


def export_tensors(params: dict, model: config_lib.ModelConfig, vocab: int) -> list:
  """(name, shape, make) of every exported tensor (understanding expert)."""
  out = []
  for e in hf_arch.tensor_table("model.", model):
    def make(e=e):
      return hf_arch.hf_view(e.kind, hf_arch.mot_array(params, model, e), vocab)
    out.append((e.name, make().shape, make))
  return out


def _run_tokenizer(config) -> tuple[tokenizer.Tokenizer, int, dict | None]:
  """(tokenizer, pretrained vocabulary size, original config.json or None) of a run."""
  try:
    tok = tokenizer.from_config(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if not isinstance(tok, tokenizer.HFTokenizer):
    return tok, tok.vocab_size, None
  original = os.path.join(os.path.dirname(tok.path), hf_io.CONFIG)
  hf = hf_io.read_json(original, "") if os.path.isfile(original) else None
  return tok, tok.text_vocab_size, hf


def to_hf(workdir: str, out: str, step: int | None = None, dtype: str = "float32") -> None:
  """Writes the understanding path of `workdir`'s checkpoint (EMA parameters) as a
  Hugging Face folder `out` (which must not exist or be empty)."""
  if dtype not in hf_io.EXPORT_DTYPES:
    raise ConfigError(f"--dtype={dtype!r} is unknown: use one of "
                      f"{sorted(hf_io.EXPORT_DTYPES)}")
  params, saved, at_step = ckpt_lib.restore_params(workdir, step)
  config = config_upgrade.upgrade_config(saved)
  model = config_lib.ModelConfig.from_config(config.model)
  config_lib.validate_model(model)
  tok, vocab, original = _run_tokenizer(config)
  hf = hf_arch.hf_config(model, vocab, original, dtype)
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise ConfigError(f"--out {out} already exists and is not empty: pass a new "
                      "directory")
  params = jax.tree.map(np.asarray, jax.device_get(params))
  staging = _staging(out)
  try:
    os.makedirs(staging)
    if isinstance(tok, tokenizer.HFTokenizer):   # the tokenizer files (config.json: ours)
      copy_files(os.path.dirname(tok.path), staging)
    with open(os.path.join(staging, hf_io.CONFIG), "w") as f:
      json.dump(hf, f, indent=2)
    hf_io.write_safetensors(os.path.join(staging, hf_io.SINGLE),
                            export_tensors(params, model, vocab), dtype)
    _publish(staging, out)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  logging.info("Wrote %s (%s, step %d, %s)", out, hf["architectures"][0], at_step, dtype)


# ----------------------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------------------
FLAGS = flags.FLAGS


def main(argv):
  commands = {"from_hf": ("hf_dir", "workdir"), "to_hf": ("workdir", "out")}
  if len(argv) != 2 or argv[1] not in commands:
    cli.fail(f"expected one command, from_hf or to_hf, got {argv[1:]} (see --help)")
  missing = [f"--{name}" for name in commands[argv[1]] if not FLAGS[name].value]
  if missing:
    cli.fail(f"{argv[1]} needs {' and '.join(missing)} (see --help)")
  cli.configure_logging()
  with cli.clean_errors():
    if argv[1] == "from_hf":
      from_hf(FLAGS.hf_dir, FLAGS.workdir, FLAGS.experts, FLAGS.config)
    else:
      to_hf(FLAGS.workdir, FLAGS.out, FLAGS.step, FLAGS.dtype)


def define_flags():
  """The command's flags (defined only when run as a program, not on import)."""
  flags.DEFINE_string("hf_dir", None, "from_hf: the Hugging Face model folder (config.json, "
                      "model.safetensors or its index, tokenizer.json).")
  flags.DEFINE_string("workdir", None, "from_hf: the mot workdir to write (new or empty); "
                      "to_hf: the workdir whose checkpoint is exported.")
  flags.DEFINE_enum("experts", "shared", list(EXPERTS), "from_hf: 'shared' (one set of "
                    "weights) or 'mode' (the generation expert starts as a copy, BAGEL).")
  config_flags.DEFINE_config_file(
      "config", None, "from_hf: the run config the workdir is built on, e.g. "
      "configs/shapes.py or configs/shapes.py:tiny (default: configs/digits.py): its data, "
      "training and non-backbone model fields (patch_dim, modality_patch_dims, "
      "time_embed_dim) stay, the backbone's come from config.json. Fine-tune with the "
      "matching configs/pretrained.py variant, e.g. configs/pretrained.py:shapes.",
      lock_config=True)
  flags.DEFINE_string("out", None, "to_hf: the folder to write (new or empty).")
  flags.DEFINE_integer("step", None, "to_hf: the checkpoint step (default: the newest).")
  flags.DEFINE_enum("dtype", "float32", sorted(hf_io.EXPORT_DTYPES),
                    "to_hf: dtype of the written weights (float32 is exact).")


if __name__ == "__main__":   # no cli.tune_malloc: it would keep freed host memory mapped
  define_flags()
  cli.run(main)
