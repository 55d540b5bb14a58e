"""Your own images and captions: a folder with captions.jsonl, a .jsonl file, or ArrayRecord.

The digits model and task mix (caption -> image, image + question -> caption, caption LM)
on your pairs (see mot/data/user_data.py). The image size and channels come from the
data unless set: the most common size, RGB unless every image is grayscale; the patch
widths and the answer length follow (mot/data/auto_config.py), and train.py says what
it chose in one log line. Every checkpoint saves them, so sample.py reads a file exactly
as training did (mot/data/preprocess.py).

  python train.py --config configs/image_folder.py --workdir DIR --config.data.path=/path/to/folder
  python train.py --config configs/image_folder.py:tiny --workdir /tmp/tiny \\
      --config.data.path=pairs.jsonl
  python train.py --config configs/image_folder.py --workdir DIR \\
      --config.data.dataset=array_record --config.data.path='/data/train-*.array_record'
  python sample.py --workdir DIR --mode reason --images photo.jpg    # asks data.question
  python sample.py --workdir DIR --mode generate --prompt "a red bicycle" --out samples/

/path/to/folder/captions.jsonl has one line per image, paths relative to the folder:
  {"image": "img/0001.png", "caption": "a red bicycle"}

Variants (the part after ':'): "" (default) and "tiny", as in configs/digits.py. Any size
works, non-square too, with a patch size that divides it, e.g. 32x48 RGB in 4x4 patches:
  --config.data.image_size='(32, 48)' --config.data.patch_size=4 --config.data.seq_len=512
Latent diffusion (docs/design.md §9): encode the images once with a VAE (a diffusers
AutoencoderKL folder), then train on its latents (2x2 patches of the latent):
  python -m mot.data.user_data /path/to/folder cache/ --vae /path/to/vae
  python train.py --config configs/image_folder.py --workdir DIR \\
      --config.data.path=/path/to/folder --config.latent.vae=/path/to/vae \\
      --config.data.latent_cache=cache/
data.path has no default: training stops with a one-line error until it is set.
"""
import ml_collections

from configs import digits


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  try:
    c = digits.get_config(arg)
  except ValueError:
    raise ValueError(f"configs/image_folder.py has no variant {arg!r}: use '' or 'tiny'") \
        from None
  d = c.data
  d.dataset = "image_folder"         # "image_folder" (folder or .jsonl) | "array_record"
  d.path = ""                        # REQUIRED: folder with captions.jsonl, .jsonl or ArrayRecord
  del d["image_size"]                # an int there (the digits' 8); a pair here
  d.image_size = ()                  # (H, W) (or S: S x S) images are resized to; (): the
                                     # most common size in the data
  d.channels = 0                     # 1 grayscale | 3 RGB; 0: RGB unless every image is gray
  d.patch_dim = 0                    # patches field width; 0: patch_size**2 * channels
  d.question = "Describe this image."  # the reading task's question (sample.py asks it)
  d.latent_cache = ""                # latent runs (config.latent.vae): the cache written by
                                     # python -m mot.data.user_data DATA CACHE --vae VAE
  d.invert = False                   # True: dark ink on light paper becomes high, like the digits
  d.resize = "crop"                  # to the aspect of image_size: "crop" | "pad" | "stretch"
  d.num_heldout = 64                 # last pairs held out for eval (at most a tenth, at least 1)
  d.shift_pixels = 0                 # no shift augmentation: photos have no blank border
  d.seq_len = 256                    # room for two examples with captions up to ~90 bytes
  d.examples_per_row = 2             # examples drawn per packed row
  if c.variant == "default":
    c.batch_size = 32                # rows a step (64 examples; the digits default's rows
                                     # hold one example each, 96 a step)
    c.eval_samples_per_digit = 8     # user data: images drawn per held-out caption for the
                                     # evaluation grid (mot/eval_user.py; 0: off)
  d.task_weights = ml_collections.ConfigDict(
      {"generation": 0.45, "reasoning": 0.45, "text": 0.1})  # no digit-only tasks
  c.sample.reason_shifts = 0         # read photos as given (they were not shifted in training)
  c.sample.max_new_tokens = 0        # answer tokens; 0: the longest caption + EOS (from the data)
  c.model.modality_patch_dims = ()   # (0, d, d, 2), d = an image patch's values; (): derived
  return c
