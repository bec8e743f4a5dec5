"""HALO-Agent learner: LoRA policy updates (dr_grpo, DPO) and colocated sampling for Qwen3-VL on Temporal."""
