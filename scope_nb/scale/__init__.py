"""The GPU path: FSDP and megatron-core trainers, SGLang and vLLM engines, Ray, and the launchers."""
