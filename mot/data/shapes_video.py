"""Shapes video (issue #39, deliverable 5): the Shapes scenes in motion, with an agent.

Every frame obeys the Shapes scene contract (`mot.data.shapes_scene`: 32x32 RGB, black
background, flat palette colours, square / circle / triangle, box side 7..11, 1..4
objects) and is drawn by its renderer; this module only moves the boxes:

- Objects move with constant integer velocities, one of DIRECTIONS (right, left, up,
  down) times a speed in SPEEDS (1 or 2 px a frame), and bounce off the walls: a step
  that would leave the image reflects the box's position at the wall and reverses that
  velocity component (`simulate`).
- The agent (action clips only; named in the text, e.g. "the agent is the red circle")
  moves by its action chunk instead: action k, (dx, dy) in AGENT_MOVES, takes frame k to
  frame k + 1, so a clip of T frames has T - 1 actions. Actions are drawn among those that
  keep the agent on the image, so the action is always the agent's true displacement
  (inverse dynamics is well posed); the agent's (colour, shape) is unique in its scene.
- Overlaps: a clip is kept only when every frame keeps every two boxes GAP (2) px apart
  on at least one axis, as the contract asks of a still scene, and no object bounces on
  the first step (so frames 0 -> 1 show each object's velocity, the answer to "Which way
  is the red circle moving?"). Otherwise the velocities / actions and, after a few tries,
  the layout are drawn again (rejection): objects never touch or occlude, and the
  detector reads every frame exactly.
- Held-out pairs never appear in training clips (training draws training types only,
  `shapes_scene.sample_kinds`); clips whose first frame `shapes.is_eval_scene` reserves
  are never trained on; evaluation sets are fixed by their own keys (`eval_clip`).

Everything is a pure function of a numpy Generator (`rng_for` keys), so a clip is
reproducible from its key.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from mot.data import shapes
from mot.data import shapes_scene
from mot.data.shapes_scene import Scene
from mot.data.shapes_scene import SceneObject
from mot.data.shapes_scene import ShapesOptions

NUM_FRAMES = 6
DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "up": (0, -1), "down": (0, 1)}
DIRECTION_NAMES = tuple(DIRECTIONS)
SPEEDS = (1, 2)
# The agent's per-step (dx, dy): stay, or 1 or 2 px along one axis.
AGENT_MOVES = ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1), (2, 0), (-2, 0), (0, 2), (0, -2))
ACTION_DIM = 2
# Scene kinds of each clip family (shapes_scene.KINDS): captions name one or two objects;
# questions and action clips see any mix.
CAPTION_KINDS = ("single", "pair")
MIXED_KINDS = ("single", "count", "pair", "mixed")
ACTION_KINDS = ("single", "pair", "mixed")
_TRIES = 50         # motions tried per layout
_LAYOUTS = 200      # layouts tried per clip (validated options always succeed far earlier)


@dataclasses.dataclass(frozen=True)
class VideoClip:
  """One clip: objects (in frame 0's `Scene` order) and their trajectories.

  Attributes:
    objects: frame 0's objects (sorted as `Scene` sorts them).
    positions: int [N, T, 2] (top, left) of each object's box per frame.
    velocities: int [N, 2] (vx, vy) at frame 0 (the agent's row: zeros).
    agent: index of the agent in `objects`, or -1 (no actions).
    actions: float32 [T - 1, 2] the agent's (dx, dy) per step ([T - 1, 2] zeros: none).
    image_size: side of the frames.
  """
  objects: tuple[SceneObject, ...]
  positions: np.ndarray
  velocities: np.ndarray
  agent: int
  actions: np.ndarray
  image_size: int = 32

  @property
  def num_frames(self) -> int:
    return int(self.positions.shape[1])

  def scene(self, t: int) -> Scene:
    """The `Scene` of frame t (objects at their positions there)."""
    return Scene(tuple(dataclasses.replace(o, top=int(p[0]), left=int(p[1]))
                       for o, p in zip(self.objects, self.positions[:, t])), self.image_size)

  def frames(self) -> np.ndarray:
    """uint8 [T, S, S, 3]: every frame drawn by the Shapes renderer."""
    return np.stack([shapes_scene.render(self.scene(t)) for t in range(self.num_frames)])

  def direction(self, i: int) -> str:
    """Object i's direction word: its displacement from frame 0 to frame 1."""
    return direction_word(self.positions[i, 1] - self.positions[i, 0])


def direction_word(displacement) -> str:
  """The DIRECTIONS name of a (drow, dcol) displacement (its larger axis), or "still"."""
  drow, dcol = (float(v) for v in displacement)
  if drow == dcol == 0:
    return "still"
  if abs(dcol) >= abs(drow):
    return "right" if dcol > 0 else "left"
  return "down" if drow > 0 else "up"


def simulate(starts: np.ndarray, velocities: np.ndarray, sizes, image_size: int,
             num_frames: int, agent: int = -1, actions=None) -> tuple[np.ndarray, np.ndarray]:
  """(int [N, T, 2] (top, left) per frame, bool [N, T - 1] whether object n bounced on
  step k). Objects move by their (vx, vy) and bounce off the walls; the agent (index
  `agent`) moves by `actions` [T - 1, 2] (dx, dy) and must stay on the image."""
  pos = np.asarray(starts, np.int64).copy()
  vel = np.asarray(velocities, np.int64)[:, ::-1].copy()    # (vx, vy) -> (drow, dcol)
  hi = image_size - np.asarray(sizes, np.int64)[:, None]   # largest top / left per object
  out, bounced = [pos.copy()], []
  for k in range(num_frames - 1):
    nxt = pos + vel
    if agent >= 0:
      nxt[agent] = pos[agent] + np.round(np.asarray(actions[k], np.float64)[::-1]).astype(int)
      if np.any(nxt[agent] < 0) or np.any(nxt[agent] > hi[agent]):
        raise ValueError(f"action {k} {list(actions[k])} moves the agent off the image")
    low, high = nxt < 0, nxt > hi
    nxt = np.where(low, -nxt, np.where(high, 2 * hi - nxt, nxt))
    vel = np.where(low | high, -vel, vel)
    bounced.append((low | high).any(axis=1))
    pos = nxt
    out.append(pos.copy())
  hits = np.stack(bounced, axis=1) if bounced else np.zeros((len(pos), 0), bool)
  return np.stack(out, axis=1), hits


def apart(positions: np.ndarray, sizes) -> bool:
  """Whether every frame keeps every two boxes GAP px apart on at least one axis."""
  s, gap = np.asarray(sizes, np.int64), shapes_scene.GAP
  for i in range(len(s)):
    for j in range(i + 1, len(s)):
      a, b = positions[i], positions[j]                      # [T, 2] (top, left)
      sep = (b >= a + s[i] + gap) | (a >= b + s[j] + gap)    # per axis
      if not np.all(sep.any(axis=1)):
        return False
  return True


def _velocities(rng: np.random.Generator, n: int) -> np.ndarray:
  dirs = rng.integers(len(DIRECTIONS), size=n)
  speeds = np.asarray(SPEEDS)[rng.integers(len(SPEEDS), size=n)]
  return np.asarray([DIRECTIONS[DIRECTION_NAMES[d]] for d in dirs], np.int64) * speeds[:, None]


def agent_actions(rng: np.random.Generator, start, size: int, image_size: int,
                  num_frames: int) -> np.ndarray:
  """float32 [T - 1, 2]: each step a move of AGENT_MOVES drawn among those that keep the
  agent's box on the image."""
  top, left = (int(v) for v in start)
  hi, out = image_size - size, []
  for _ in range(num_frames - 1):
    ok = [(dx, dy) for dx, dy in AGENT_MOVES if 0 <= top + dy <= hi and 0 <= left + dx <= hi]
    dx, dy = ok[int(rng.integers(len(ok)))]
    out.append((dx, dy))
    top, left = top + dy, left + dx
  return np.asarray(out, np.float32).reshape(-1, ACTION_DIM)


def _motion(rng, scene: Scene, num_frames: int, with_agent: bool) -> VideoClip | None:
  """A valid motion of `scene`'s objects (module doc), or None after _TRIES draws."""
  objs, n = scene.objects, len(scene.objects)
  sizes = [o.height for o in objs]
  starts = np.asarray([(o.top, o.left) for o in objs], np.int64)
  agent = -1
  if with_agent:
    unique = [i for i, o in enumerate(objs) if scene.count(o.color, o.shape) == 1]
    if not unique:
      return None
    agent = unique[int(rng.integers(len(unique)))]
  for _ in range(_TRIES):
    vel = _velocities(rng, n)
    actions = np.zeros((num_frames - 1, ACTION_DIM), np.float32)
    if agent >= 0:
      vel[agent] = 0
      actions = agent_actions(rng, starts[agent], sizes[agent], scene.image_size, num_frames)
    pos, bounced = simulate(starts, vel, sizes, scene.image_size, num_frames, agent, actions)
    if (num_frames < 2 or not bounced[:, 0].any()) and apart(pos, sizes):
      return VideoClip(objs, pos, vel, agent, actions, scene.image_size)
  return None


def draw_clip(rng: np.random.Generator, kinds: tuple[str, ...], options: ShapesOptions,
              num_frames: int = NUM_FRAMES, split: str | None = None,
              with_agent: bool = False) -> VideoClip:
  """A random clip: a scene of one of `kinds` (training types for split None and
  "in_distribution", a held-out pair in it for "heldout"; training and in-distribution
  first frames on their side of `shapes.is_eval_scene`), then a valid motion of it."""
  heldout = split == "heldout"
  for _ in range(_LAYOUTS):
    kind = kinds[int(rng.integers(len(kinds)))]
    scene = shapes_scene.sample_scene(rng, kind, options, heldout)
    if not heldout and shapes.is_eval_scene(scene) != (split == "in_distribution"):
      continue
    clip = _motion(rng, scene, num_frames, with_agent)
    if clip is not None:
      return clip
  raise ValueError(f"cannot draw a {num_frames}-frame clip of {kinds} with {options}: "
                   "fewer or smaller objects, or fewer frames")


def training_clip(family: str, key: int, options: ShapesOptions,
                  num_frames: int = NUM_FRAMES) -> VideoClip:
  """Clip `key` of a training family ("caption", "mixed", "action")."""
  rng = shapes_scene.rng_for("video/train/" + family, key)
  return draw_clip(rng, FAMILY_KINDS[family], options, num_frames, None, family == "action")


def eval_clip(family: str, split: str, index: int, options: ShapesOptions,
              num_frames: int = NUM_FRAMES) -> VideoClip:
  """Item `index` of a fixed evaluation set (independent of any training seed)."""
  if split not in shapes.SPLITS:
    raise ValueError(f"unknown split {split!r}: use one of {shapes.SPLITS}")
  rng = shapes_scene.rng_for(f"video/eval/{family}/{split}", index)
  return draw_clip(rng, FAMILY_KINDS[family], options, num_frames, split,
                   family == "action")


FAMILY_KINDS = {"caption": CAPTION_KINDS, "mixed": MIXED_KINDS, "action": ACTION_KINDS}


# ---------------------------------------------------------------------------- text


def caption(clip: VideoClip) -> str:
  """E.g. "a red circle moving left and a blue square moving up" (frame 0's order)."""
  return " and ".join(f"a {o.color} {o.shape} moving {clip.direction(i)}"
                      for i, o in enumerate(clip.objects))


def agent_text(clip: VideoClip) -> str:
  """"the agent is the red circle": names the object the actions move."""
  o = clip.objects[clip.agent]
  return f"the agent is the {o.color} {o.shape}"


def actions_prompt(clip: VideoClip) -> str:
  """The inverse-dynamics prompt, e.g. "actions of the red circle:"."""
  o = clip.objects[clip.agent]
  return f"actions of the {o.color} {o.shape}:"


def direction_question(color: str, shape: str) -> str:
  return f"Which way is the {color} {shape} moving?"


def clip_questions(clip: VideoClip, colors) -> dict[str, list[tuple[str, str]]]:
  """{qtype: [(question, answer)]} of the well-defined questions about a clip: the
  direction of each object whose (colour, shape) is unique, the count, the colour counts
  over `colors`."""
  scene = clip.scene(0)
  out = {"direction": [], "count": [("How many objects are there?", str(len(clip.objects)))],
         "count_color": [(f"How many {c} objects are there?", str(scene.count(c)))
                         for c in colors]}
  for i, o in enumerate(clip.objects):
    if scene.count(o.color, o.shape) == 1:
      out["direction"].append((direction_question(o.color, o.shape), clip.direction(i)))
  return out


QTYPES = ("direction", "count", "count_color")
