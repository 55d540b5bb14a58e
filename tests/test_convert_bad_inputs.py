"""The bad-input catalogue of `python -m mot.convert`: each case exits non-zero with one
`error:` line naming the file or tensor, no traceback, and writes nothing."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from safetensors.numpy import load_file, save_file

from tests._procs import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")


def edit_config(folder, **changes):
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    cfg = json.load(f)
  cfg.update(changes)
  with open(path, "w") as f:
    json.dump(cfg, f)


def edit_weights(folder, edit):
  path = os.path.join(folder, "model.safetensors")
  tensors = load_file(path)
  edit(tensors)
  save_file(tensors, path)


def truncate(path, cut=100):
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:-cut])


# name -> (fixture to copy, how to break the copy, what the error line must name)
CASES = {
    "no config.json": ("qwen3_tied", lambda d: os.remove(os.path.join(d, "config.json")),
                       "config.json"),
    "unsupported architecture": (
        "qwen3_tied", lambda d: edit_config(d, architectures=["LlamaForCausalLM"]),
        "LlamaForCausalLM"),
    "missing tensor": (
        "qwen3_tied",
        lambda d: edit_weights(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
        "model.layers.1.mlp.up_proj.weight"),
    "extra tensor": (
        "qwen3_tied",
        lambda d: edit_weights(d, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": t[
            "model.layers.0.input_layernorm.weight"]})),
        "model.layers.0.self_attn.o_proj.bias"),
    "tied head differs from the embedding": (
        "qwen3_tied",
        lambda d: edit_weights(d, lambda t: t.update({"lm_head.weight": t[
            "model.embed_tokens.weight"] * 1.01})),
        "lm_head.weight"),
    "shape disagrees with config.json": (
        "qwen3_tied", lambda d: edit_config(d, intermediate_size=64),
        "model.layers.0.mlp.gate_proj.weight"),
    "truncated safetensors file": (
        "qwen3_tied", lambda d: truncate(os.path.join(d, "model.safetensors")),
        "model.safetensors"),
    "truncated shard": (
        "qwen2_untied", lambda d: truncate(os.path.join(d, "model-00002-of-00003.safetensors")),
        "model-00002-of-00003.safetensors"),
    "shard missing": (
        "qwen2_untied", lambda d: os.remove(os.path.join(d, "model-00003-of-00003.safetensors")),
        "model-00003-of-00003.safetensors"),
    "no tokenizer.json": ("qwen2_untied", lambda d: os.remove(os.path.join(d, "tokenizer.json")),
                          "tokenizer.json"),
    "sliding window": ("qwen2_untied", lambda d: edit_config(d, use_sliding_window=True),
                       "use_sliding_window"),
}


def run_convert(*args):
  return subprocess.run([sys.executable, "-m", "mot.convert", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


def check_clean_failure(proc, names=None):
  assert proc.returncode != 0, proc.stdout[-500:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  errors = [l for l in proc.stderr.strip().splitlines() if l.startswith("error:")]
  assert len(errors) == 1, proc.stderr[-2000:]
  if names:
    assert names in errors[0], errors[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_from_hf_bad_checkpoint(tmp_path, case):
  fixture, breaks, names = CASES[case]
  hf_dir = tmp_path / "hf"
  shutil.copytree(os.path.join(GOLDEN, fixture), hf_dir)
  breaks(str(hf_dir))
  proc = run_convert("from_hf", "--hf_dir", str(hf_dir), "--workdir", str(tmp_path / "out"))
  check_clean_failure(proc, names)
  assert sorted(os.listdir(tmp_path)) == ["hf"]   # no workdir, no half-written staging


@pytest.mark.parametrize("case", ["holds another run", "is a file"])
def test_from_hf_refuses_a_used_workdir(tmp_path, case):
  target = tmp_path / "used"
  if case == "is a file":
    target.write_text("not a directory\n")
  else:
    target.mkdir()
    (target / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
  before = snapshot(tmp_path)
  proc = run_convert("from_hf", "--hf_dir", os.path.join(GOLDEN, "qwen3_tied"),
                     "--workdir", str(target))
  check_clean_failure(proc, str(target))
  assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args", [[], ["export"], ["from_hf", "--workdir", "W"],
                                  ["to_hf", "--workdir", "W"],
                                  ["from_hf", "--hf_dir", "H", "--workdir", "W",
                                   "--experts", "modality"]])
def test_bad_command_lines(tmp_path, args):
  proc = run_convert(*[str(tmp_path / a) if a in ("W", "H") else a for a in args])
  check_clean_failure(proc)
  assert os.listdir(tmp_path) == []


def test_to_hf_bad_inputs(tmp_path):
  """A workdir without a checkpoint, and an --out that holds files."""
  (tmp_path / "empty").mkdir()
  proc = run_convert("to_hf", "--workdir", str(tmp_path / "empty"), "--out",
                     str(tmp_path / "out"))
  check_clean_failure(proc, str(tmp_path / "empty"))
  assert sorted(os.listdir(tmp_path)) == ["empty"]
