"""Your own images and captions: a folder with captions.jsonl, a .jsonl file, or ArrayRecord.

The digits model and task mix (caption -> image, image -> caption, caption LM) on your
pairs, resized to data.image_size x data.image_size grayscale (see mot/data/user_data.py).

  python train.py --config configs/image_folder.py --workdir DIR --config.data.path=/path/to/folder
  python train.py --config configs/image_folder.py:tiny --workdir /tmp/tiny \\
      --config.data.path=pairs.jsonl
  python train.py --config configs/image_folder.py --workdir DIR \\
      --config.data.dataset=array_record --config.data.path='/data/train-*.array_record'

/path/to/folder/captions.jsonl has one line per image, paths relative to the folder:
  {"image": "img/0001.png", "caption": "a red bicycle"}

Variants (the part after ':'): "" (default) and "tiny", as in configs/digits.py. Larger
images need matching patches, e.g. 32x32 in 4x4 patches:
  --config.data.image_size=32 --config.data.patch_size=4 --config.data.patch_dim=16 \\
  --config.model.modality_patch_dims='(0,16,16,2)' --config.data.seq_len=512
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
  d.image_size = 8                   # images are resized to image_size x image_size (grayscale)
  d.invert = False                   # True: dark ink on light paper becomes high, like the digits
  d.resize = "crop"                  # "crop" a centred square | "pad" to a square | "stretch"
  d.num_heldout = 64                 # last pairs held out for eval (at most a tenth, at least 1)
  d.shift_pixels = 0                 # no shift augmentation: photos have no blank border
  d.seq_len = 256                    # room for two examples with captions up to ~90 bytes
  d.examples_per_row = 2             # examples drawn per packed row
  if c.variant == "default":
    c.batch_size = 32                # rows a step (64 examples; the digits default's rows
                                     # hold one example each, 96 a step)
  d.task_weights = ml_collections.ConfigDict(
      {"generation": 0.45, "reasoning": 0.45, "text": 0.1})  # no digit-only tasks
  c.sample.reason_shifts = 0         # read photos as given (they were not shifted in training)
  return c
