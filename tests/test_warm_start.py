"""Fine-tuning a converted model: `--config.init_from` (mot.warm_start), the tokenizer of
the checkpoint through data, training and sampling, and freezing the understanding path."""
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import pretrained
from mot import checkpoint as ckpt_lib
from mot import convert, sampling, tokenizer, train_lib
from mot.data import input_pipeline
from mot.pipeline import Pipeline
from tests._procs import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """qwen2_untied converted with a generation expert (BAGEL)."""
  out = str(tmp_path_factory.mktemp("converted") / "qwen2")
  convert.from_hf(os.path.join(GOLDEN, "qwen2_untied"), out, experts="mode")
  return out


def finetune_config(init_from, steps, **overrides):
  config = pretrained.get_config("tiny")
  config.init_from = init_from
  config.num_train_steps = steps
  config.checkpoint_every_steps = config.eval_every_steps = 2
  for key, value in overrides.items():
    config[key] = value
  return config


@pytest.fixture(scope="module")
def finetuned(converted, tmp_path_factory):
  """Two steps of configs/pretrained.py:tiny from the converted model, understanding
  frozen: the run's workdir."""
  run = str(tmp_path_factory.mktemp("finetuned") / "run")
  train_lib.train_and_evaluate(finetune_config(converted, 2, freeze_understanding=True), run)
  return run


def test_data_uses_the_checkpoint_tokenizer(converted):
  config = pretrained.get_config("tiny")
  config.init_from = converted
  from mot import warm_start
  config = warm_start.resolve(config)
  tok = tokenizer.from_config(config)
  assert isinstance(tok, tokenizer.HFTokenizer) and tok.vocab_size == 308
  ex = input_pipeline.heldout_examples(config.data, "generation", tok)[0]
  text = ex["tokens"][ex["modality"] == 0]
  assert text[0] == tok.bos_id and text[-1] == tok.eos_id
  assert tok.begin("image") in text and tok.end("image") in text
  assert tok.decode(text) == "a handwritten digit " + tok.decode(text).split()[-1]
  assert np.all(ex["tokens"][ex["modality"] > 0] == tok.pad_id)
  batch = next(iter(input_pipeline.make_train_dataset(config.data, 0, 2, tokenizer=tok)))
  assert batch["tokens"].max() < tok.vocab_size


def test_frozen_understanding_keeps_text_logits_bit_identical(converted, finetuned):
  """Training moved the generation path; the text path's logits did not change a bit,
  with the EMA parameters (sampling's) and the raw ones."""
  tokens = np.load(os.path.join(GOLDEN, "qwen2_untied", "golden.npz"))["tokens"][:, :96]
  before = Pipeline.from_workdir(converted)
  after = Pipeline.from_workdir(finetuned)
  assert after.step == 2 and after.config.tokenizer == before.config.tokenizer
  np.testing.assert_array_equal(after.text_logits(tokens), before.text_logits(tokens))
  raw, _, _ = ckpt_lib.restore_params(finetuned, use_ema=False)
  np.testing.assert_array_equal(sampling.text_logits(after.model, raw, tokens),
                                before.text_logits(tokens))
  moved = np.abs(np.asarray(raw["dm_head"]["out"]["kernel"])
                 - np.asarray(before.params["dm_head"]["out"]["kernel"])).max()
  assert moved > 0


def test_both_heads_sample_with_the_checkpoint_tokenizer(finetuned):
  pipe = Pipeline.from_workdir(finetuned)
  answer = pipe.reason("What digit is this?", images=np.zeros((8, 8)), max_new_tokens=4)
  assert isinstance(answer, str)
  images = pipe.generate("a handwritten digit 3", steps=2)
  assert images.shape == (1, 8, 8) and np.isfinite(images).all()


def test_a_run_with_checkpoints_resumes_instead(converted, finetuned):
  """The same command on a workdir with checkpoints restores them (here: already at its
  last step, so nothing is left to train), not init_from's weights."""
  state = train_lib.train_and_evaluate(finetune_config(converted, 2,
                                                       freeze_understanding=True), finetuned)
  assert int(state.step) == 2 and ckpt_lib.available_steps(finetuned) == [2]
  trained, _, _ = ckpt_lib.restore_params(finetuned, use_ema=False)
  np.testing.assert_array_equal(np.asarray(state.params["dm_head"]["out"]["kernel"]),
                                np.asarray(trained["dm_head"]["out"]["kernel"]))


def run_train(*args):
  return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)


def one_error_line(proc):
  assert proc.returncode != 0, proc.stdout[-500:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.strip().splitlines() if l.startswith("error:")]
  assert len(errors) == 1, proc.stderr[-2000:]
  return errors[0]


@pytest.mark.parametrize("case", ["not a workdir", "conflicting field", "other config",
                                  "no init_from"])
def test_init_from_bad_inputs(converted, tmp_path, case):
  (tmp_path / "plain").mkdir()
  (tmp_path / "plain" / "notes.txt").write_text("not a workdir\n")
  args = {"not a workdir": ["--config", "configs/pretrained.py:tiny",
                            f"--config.init_from={tmp_path / 'plain'}"],
          "conflicting field": ["--config", "configs/pretrained.py:tiny",
                                f"--config.init_from={converted}", "--config.model.d_model=64"],
          "other config": ["--config", "configs/digits.py:tiny",
                           f"--config.init_from={converted}"],
          "no init_from": ["--config", "configs/pretrained.py:tiny"]}[case]
  before = snapshot(tmp_path)
  line = one_error_line(run_train(*args, "--workdir", str(tmp_path / "run")))
  expected = {"not a workdir": str(tmp_path / "plain"), "conflicting field": "model.d_model=64",
              "other config": "model.vocab_size=272", "no init_from": "init_from"}[case]
  assert expected in line, line
  assert snapshot(tmp_path) == before and not (tmp_path / "run").exists()


def test_fine_tune_on_shapes(tmp_path):
  """`from_hf --config configs/shapes.py:tiny` keeps the shapes data's patch and timestep
  widths, so configs/pretrained.py:shapes:tiny starts from it (configs/digits.py's
  widths are refused) and trains the shapes task mix with the checkpoint's tokenizer; the
  frozen understanding path keeps the checkpoint's text logits bit-identical."""
  out, run = str(tmp_path / "converted"), str(tmp_path / "run")
  proc = subprocess.run([sys.executable, "-m", "mot.convert", "from_hf", "--hf_dir",
                         os.path.join(GOLDEN, "qwen3_tied"), "--workdir", out, "--experts",
                         "mode", "--config", "configs/shapes.py:tiny"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  saved = ckpt_lib.saved_config(out, 0)
  assert saved["data"]["dataset"] == "shapes" and saved["model"]["patch_dim"] == 192
  assert saved["model"]["d_model"] == 48 and saved["model"]["tie_embeddings"]
  config = pretrained.get_config("shapes:tiny")
  config.init_from = out
  config.freeze_understanding = True
  state = train_lib.train_and_evaluate(config, run)
  assert int(state.step) == 2
  tokens = np.load(os.path.join(GOLDEN, "qwen3_tied", "golden.npz"))["tokens"][:, :96]
  before, after = Pipeline.from_workdir(out), Pipeline.from_workdir(run)
  assert after.config.tokenizer == before.config.tokenizer
  assert after.config.data.dataset == "shapes"
  np.testing.assert_array_equal(after.text_logits(tokens), before.text_logits(tokens))
