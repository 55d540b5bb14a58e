"""Writes the golden fixtures of tests/test_vae.py with diffusers' own AutoencoderKL.

Needs torch and diffusers, which mot and its tests never import. Set-up (CPU torch):

  python3.11 -m venv /work/venv-golden
  /work/venv-golden/bin/pip install torch==2.13.0 diffusers==0.42.1 safetensors==0.8.0 \\
      numpy==2.4.* --extra-index-url https://download.pytorch.org/whl/cpu

Then, from the repository root:

  /work/venv-golden/bin/python tools/make_golden_vae.py          # rewrites tests/golden/

For each fixture it builds a tiny random AutoencoderKL, perturbs every parameter (diffusers
initialises GroupNorm scales to 1 and biases to 0, which would hide a swapped scale and
bias or a missing norm) and checks that each one moves the outputs, saves it with
save_pretrained under tests/golden/NAME/, and writes tests/golden/NAME.npz (float32):
  x        images [B, H, W, 3] in [-1, 1] (NHWC, as mot takes them)
  mean     posterior mean of x, [B, H/f, W/f, C]
  logvar   posterior log-variance of x (diffusers' clamp to [-30, 20] applied)
  z        random latents [B, H/f, W/f, C]
  decoded  decoder output for z, [B, H, W, 3] (not clipped)
The fixtures: vae_sd, SD-style (4 latent channels, quant convs, f=4, square 16x16 input);
vae_flux, FLUX-style (16 latent channels, no quant convs, shift_factor set, f=8, a
non-square 16x24 input, two resnets per block).

  /work/venv-golden/bin/python tools/make_golden_vae.py --check DIR --against FILE.npz

is the reverse direction: it loads a folder written by mot.vae.save_diffusers (e.g.
runs/vae_shapes/vae) with diffusers' from_pretrained, encodes FILE.npz's `x` (NHWC) and
decodes the posterior mean, and prints the relative errors against FILE.npz's `mean` and
`decoded`, which mot wrote from the same folder:

  /work/venv/bin/python -c "import numpy as np; from mot import vae; \
    v = vae.load_diffusers('runs/vae_shapes/vae'); \
    x = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3)).astype(np.float32); \
    np.savez('/tmp/mot_vae.npz', x=x, mean=v.encode(x), decoded=v.decode(v.encode(x)))"
"""
import argparse
import os

import numpy as np
import torch
from diffusers import AutoencoderKL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden")

FIXTURES = {
    "vae_sd": {
        "config": {"block_out_channels": (8, 16, 16), "layers_per_block": 1,
                   "latent_channels": 4, "norm_num_groups": 4, "use_quant_conv": True,
                   "use_post_quant_conv": True, "scaling_factor": 0.18215, "sample_size": 16},
        "image": (2, 16, 16)},
    "vae_flux": {
        "config": {"block_out_channels": (8, 8, 16, 16), "layers_per_block": 2,
                   "latent_channels": 16, "norm_num_groups": 4, "use_quant_conv": False,
                   "use_post_quant_conv": False, "scaling_factor": 0.3611,
                   "shift_factor": 0.1159, "sample_size": 16},
        "image": (2, 16, 24)},
}


def perturb(model: torch.nn.Module, gen: torch.Generator) -> None:
  """Every tensor random and non-trivial: kernels ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2),
  norm scales ~ 1 + N(0, 0.2^2), norm biases ~ N(0, 0.1^2)."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
      if p.ndim >= 2:
        p.copy_(noise / np.sqrt(p[0].numel()))
      elif "norm" in name and name.endswith("weight"):
        p.copy_(1.0 + 0.2 * noise)
      else:
        p.copy_(0.1 * noise)


def check_every_tensor_matters(model, x, z) -> None:
  """Each parameter moves the outputs: the gradient of a random projection of them, times
  the tensor's norm, is at least 1 % of the outputs' norm, 100x the tests' tolerance.
  The key projection's bias is exempt: it adds q.b_k to every score of a query alike,
  which the softmax cancels."""
  model.zero_grad()
  posterior = model.encode(x).latent_dist
  out = torch.cat([posterior.mean.flatten(), posterior.logvar.flatten(),
                   model.decode(z).sample.flatten()])
  probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
  (probe * out).sum().backward()
  for name, p in model.named_parameters():
    effect = float(p.grad.norm() * p.detach().norm() / out.detach().norm())
    if not name.endswith("to_k.bias") and effect < 1e-2:
      raise SystemExit(f"{name} barely moves the outputs ({effect:.1e}): raise its scale")
  model.zero_grad()


def nhwc(t: torch.Tensor) -> np.ndarray:
  return t.permute(0, 2, 3, 1).contiguous().numpy().astype(np.float32)


def make(name: str, spec: dict, seed: int) -> None:
  gen = torch.Generator().manual_seed(seed)
  levels = len(spec["config"]["block_out_channels"])
  model = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * levels,
                        up_block_types=("UpDecoderBlock2D",) * levels, **spec["config"])
  perturb(model, gen)
  model.eval()
  b, h, w = spec["image"]
  x = torch.rand((b, 3, h, w), generator=gen) * 2 - 1
  f = 2 ** (levels - 1)
  z = torch.randn((b, model.config.latent_channels, h // f, w // f), generator=gen)
  check_every_tensor_matters(model, x, z)
  with torch.no_grad():
    posterior = model.encode(x).latent_dist
    decoded = model.decode(z).sample
  out = os.path.join(GOLDEN, name)
  model.save_pretrained(out, safe_serialization=True)
  np.savez(os.path.join(GOLDEN, f"{name}.npz"), x=nhwc(x), mean=nhwc(posterior.mean),
           logvar=nhwc(posterior.logvar), z=nhwc(z), decoded=nhwc(decoded))
  size = os.path.getsize(os.path.join(out, "diffusion_pytorch_model.safetensors"))
  print(f"{name}: {sum(p.numel() for p in model.parameters())} parameters, {size} bytes; "
        f"mean std {posterior.mean.std():.3f}, decoded std {decoded.std():.3f}")


def check(path: str, against: str) -> None:
  model = AutoencoderKL.from_pretrained(path).eval()
  ref = np.load(against)
  x = torch.from_numpy(ref["x"]).permute(0, 3, 1, 2)
  with torch.no_grad():
    mean = model.encode(x).latent_dist.mean
    decoded = model.decode(mean).sample
  rel = lambda a, b: float(np.linalg.norm(nhwc(a) - b) / np.linalg.norm(b))
  print(f"{path}: diffusers loads it ({sum(p.numel() for p in model.parameters())} "
        f"parameters); relative error against {against}: mean "
        f"{rel(mean, ref['mean']):.2e}, decoded {rel(decoded, ref['decoded']):.2e}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", help="a folder written by mot.vae.save_diffusers")
  parser.add_argument("--against", help="with --check: mot's x, mean and decoded (.npz)")
  args = parser.parse_args()
  if args.check:
    check(args.check, args.against)
    return
  torch.manual_seed(0)
  os.makedirs(GOLDEN, exist_ok=True)
  for i, (name, spec) in enumerate(FIXTURES.items()):
    make(name, spec, seed=i)


if __name__ == "__main__":
  main()
