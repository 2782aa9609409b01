"""User simulators: OpenAI-compatible endpoints, Verbalized Sampling, local engines (llama.cpp, vLLM)
and the speakers of each user mode."""
