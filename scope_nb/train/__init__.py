"""One training run: rollouts, GRPO, model specs and user modes, the checked config,
the run loop and its crash safety."""
