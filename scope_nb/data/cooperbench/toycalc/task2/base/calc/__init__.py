"A tiny calculator."
