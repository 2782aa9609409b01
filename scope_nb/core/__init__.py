"""Records every layer shares: messages and the speaker protocol, per-role episodes,
the local policy, the packaged models, files and loggers."""
