"""The errors a user can fix. Each message is one line naming the problem and the fix;
the entry points print it as `error: ...` and exit non-zero (`mot.cli.clean_errors`).

They live in one dependency-free module so that the entry points can catch them without
importing the modules that raise them.
"""


class ConfigError(ValueError):
  """A config value that cannot work; the message names the field and the fix."""


class CheckpointError(RuntimeError):
  """A workdir or checkpoint that cannot be read, resumed or written."""


class TrainingError(RuntimeError):
  """Training cannot continue; the message says why and what to do."""


class InputError(ValueError):
  """A bad prompt, image, option or output path given to sampling or evaluation."""


class VAEError(ValueError):
  """A VAE folder, config or input that cannot be used (mot.vae); the message names the
  file or tensor and the fix."""


USER_ERRORS = (ConfigError, CheckpointError, TrainingError, InputError, VAEError)


def field(section, name: str, where: str = "config"):
  """section[name] of a config, or a ConfigError naming the undeclared field `where.name`:
  the library reads every field the run's config file declares, and invents none."""
  try:
    return section[name]
  except (KeyError, AttributeError, TypeError):
    raise ConfigError(f"{where}.{name} is not declared: add it to your config file (every "
                      "field is declared, with a comment, in configs/digits.py)") from None
