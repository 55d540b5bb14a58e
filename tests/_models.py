"""Model configs for tests that build modules directly (no run config)."""
from mot.config import ModelConfig

# A complete config.model: d256, 4 layers, byte vocabulary, float32 throughout; tests
# override what they vary.
BASE = dict(
    vocab_size=272, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
    mlp_dim=1024, patch_dim=4, modality_patch_dims=(0, 4, 4, 2), rope_sections=(8, 12, 12),
    rope_theta=10000.0, rope_interleaved=True, time_embed_dim=256, experts="shared",
    expert_impl="auto", expert_tile=256, init_generation_from_understanding=False,
    scan_layers=True, scan_unroll=1, remat_policy="none", dtype="float32",
    matmul_dtype="same", param_dtype="float32", norm_eps=1e-6, qkv_bias=False, qk_norm=True,
    tie_embeddings=False, dropout_rate=0.0, attention_impl="auto", attention_block_q=512,
    attention_block_kv=512, attention_blockwise_min_length=1024, dm_prediction="velocity",
    dm_min_time=0.05, media_pos_embed="none",
    patch_mixing="none")


def model_config(**overrides) -> ModelConfig:
  """BASE with `overrides`, as ModelConfig.from_config builds it from a run config."""
  return ModelConfig.from_config(BASE, **overrides)
