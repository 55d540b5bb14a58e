"""Your own clips and captions: a folder with captions.jsonl (GIFs, folders of frames, MP4s).

Trained and sampled like the moving digits (configs/moving_digits.py): caption -> clip
(frame by frame) and clip + question -> caption (see mot/data/user_video.py). As for image
folders, the frame size and channels come from the data unless set, and the patch widths
and answer length follow (mot/data/auto_config.py: one log line says what it chose).

  python train.py --config configs/video_folder.py --workdir DIR --config.data.path=/path/to/clips
  python train.py --config configs/video_folder.py:tiny --workdir /tmp/tiny \\
      --config.data.path=/path/to/clips
  python sample.py --workdir DIR --mode generate --prompt "a red ball rolls left" --out clips/
  python sample.py --workdir DIR --mode reason --images clip.mp4      # asks data.question

/path/to/clips/captions.jsonl has one line per clip, paths relative to the folder:
  {"video": "clips/0001.gif", "caption": "a red ball rolls left"}

Variants (the part after ':'): "" (default) and "tiny". Every clip needs at least
data.num_frames frames (the first num_frames are used).
"""
import ml_collections

from configs import image_folder


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  try:
    c = image_folder.get_config(arg)  # the image folder's fields, each documented there
  except ValueError:
    raise ValueError(f"configs/video_folder.py has no variant {arg!r}: use '' or 'tiny'") \
        from None
  d = c.data
  d.dataset = "video_folder"         # captioned clips (mot/data/user_video.py)
  d.path = ""                        # REQUIRED: folder with captions.jsonl, or a .jsonl file
  d.num_frames = 8                   # frames of each clip trained on (its first ones)
  d.video_layout = "frames"          # generated frames: one block a frame, teacher forced,
                                     # drawn frame by frame ("clip": all in one block)
  d.first_frame_weight = 1.0         # caption -> clip: loss weight of frame 0
  d.question = "Describe this clip."  # the reading task's question (sample.py asks it)
  d.patch_size = 4                   # frames cut into 4x4-pixel patches
  d.seq_len = 640                    # row length: an 8-frame 16x16 clip (15 frame blocks of
                                     # 16 patches) with its caption is ~280 tokens
  d.examples_per_row = 2             # examples drawn per packed row
  d.task_weights = ml_collections.ConfigDict(
      {"video_generation": 0.5, "video_qa": 0.5})  # caption -> clip, clip -> caption
  c.sample.cfg_scale = 2.0           # guidance, as the moving digits sample
  c.sample.steps = 24                # denoising steps a frame
  if c.variant == "tiny":
    d.num_frames = 3                 # short clips keep the test compile small
    d.seq_len = 256
    d.examples_per_row = 1
    c.sample.steps = 3
  return c
